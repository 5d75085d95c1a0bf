"""Typed parameters of the `train` flow, derived from the stage registry.

Each stage declares its settings once (components/contracts/config.py) and its place once
(components/contracts/stages.py); the flow's parameter group of a stage is those settings minus
what the flow decides itself (ROOT, SOURCE, the run id, the model name), and the flow's timeouts
are the registry's. The Prefect UI renders the descriptions as help text.
"""
from __future__ import annotations

import copy
import os
import shlex
from typing import Annotated

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, create_model

from components.contracts.config import SETTINGS_CONFIG
from components.contracts.stages import STAGES, Stage

# The demo's data and artifact ROOT, relative to where `make run` runs.
DEMO_SOURCE = ".stoke/demo/digits"
DEMO_ROOT = ".stoke/root"


def settings_model(of: Stage) -> type[BaseModel]:
    """The stage's settings without the fields the flow decides; validation kept."""
    fields = {key: (field.annotation, copy.copy(field)) for key, field in of.settings.model_fields.items()
              if key not in of.flow_decides}
    return create_model(f"{of.name.title()}Settings", __config__=SETTINGS_CONFIG,
                        __doc__=of.settings.__doc__, **fields)


def timeouts_model(stages: tuple[Stage, ...] = STAGES) -> type[BaseModel]:
    """Minutes each stage program may run, one field per stage the flow starts as a program."""
    fields = {s.name: (float, Field(s.timeout_minutes, gt=0, description=f"minutes for {s.name}",
                                    validation_alias=AliasChoices(s.name, *s.aliases)))
              for s in stages if s.timeout_minutes is not None}
    return create_model("Timeouts", __config__=ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False),
                        __doc__="Minutes each stage program may run before it is stopped (SIGTERM, then SIGKILL).",
                        **fields)


# One parameter group per stage with settings, named as the stage: the flow's parameters and the
# option groups of `stoke run`.
SETTINGS: dict[str, type[BaseModel]] = {s.name: settings_model(s) for s in STAGES if s.settings is not None}
PreflightSettings, IngestSettings, DataCheckSettings, TrainSettings, GateSettings, PushSettings = (
    SETTINGS[name] for name in ("preflight", "ingest", "datacheck", "train", "gate", "push"))
Timeouts = timeouts_model()


# Beam options a run may set: how much of the runner it uses, never which runner, what it runs or
# with which credentials. Those belong to the deployment (BEAM_ARGS_ENV, set by `stoke up` or
# `stoke deploy --beam-args-file`): anyone who can start a run could otherwise pass
# `--environment_type=beam:env:harness_subprocess_python:v1 --environment_config=COMMAND` and
# have COMMAND run through a shell on the workers.
RUN_BEAM_OPTIONS = ("direct_num_workers", "direct_running_mode", "num_workers", "max_num_workers",
                    "autoscaling_algorithm", "machine_type", "worker_machine_type", "disk_size_gb",
                    "number_of_worker_harness_threads", "parallelism")
BEAM_ARGS_ENV = "STOKE_BEAM_ARGS"


def check_beam_args(args: list[str]) -> list[str]:
    """The run's Beam options, each `--name=value` with a name from RUN_BEAM_OPTIONS."""
    for arg in args:
        name = arg.split("=", 1)[0]
        if not arg.startswith("--") or "=" not in arg or name[2:] not in RUN_BEAM_OPTIONS:
            raise ValueError(f"{arg.split('=', 1)[0]!r} is not an option a run may set; runner, environment and "
                             "credentials belong to the deployment (`stoke up` or `stoke deploy` --beam-args-file). "
                             f"A run may set --NAME=VALUE for: {', '.join(RUN_BEAM_OPTIONS)}")
    return args


BeamArgs = Annotated[list[str], AfterValidator(check_beam_args)]


def read_beam_args(path: str) -> str:
    """A Beam options file such as infra/beam/dataflow.args (one option a line, # comments)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    return " ".join(shlex.quote(line) for line in lines)


def deployment_beam_args() -> list[str]:
    """The deployment's Beam options, from the environment of the process running the flow."""
    return shlex.split(os.environ.get(BEAM_ARGS_ENV, ""))
