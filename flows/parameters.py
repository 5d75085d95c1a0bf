"""Typed parameters of the `train` flow, derived from the stages' own config models.

Each stage declares its settings once, in components/contracts/config.py; the flow's parameter models are
those same fields minus what the flow decides itself (ROOT, SOURCE, the run id), with the demo's
values as defaults so a bare `stoke run` or `prefect deployment run train/nightly` finishes in
minutes on a laptop. The Prefect UI renders the descriptions as help text.
"""
from __future__ import annotations

import copy
import os
import shlex
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from components.contracts import config

# The demo's data and artifact ROOT, relative to where `make run` runs.
DEMO_SOURCE = ".stoke/demo/digits"
DEMO_ROOT = ".stoke/root"
DEMO_EPOCHS = 8  # 400 steps at batch 32: 0.96-0.98 eval accuracy on the digits (README, Training)


def derived(name: str, model: type[BaseModel], drop: set[str], **defaults) -> type[BaseModel]:
    """`model` without the fields in `drop`, with some defaults replaced; validation kept."""
    fields = {}
    for key, field in model.model_fields.items():
        if key in drop:
            continue
        if key in defaults:
            field = copy.copy(field)
            field.default = defaults[key]
        fields[key] = (field.annotation, field)
    return create_model(name, __config__=ConfigDict(extra="forbid", protected_namespaces=()),
                        __doc__=model.__doc__, **fields)


# The digits are 32x32: small_cnn at that size trains in seconds per epoch on a CPU. No flips:
# a mirrored digit is another glyph, not the same digit.
ModelSettings = derived("ModelSettings", config.TrainConfig, drop={"root", "run_id", "epochs"},
                        image_size=32, batch_size=32, probe_steps=10, flip=False)
IngestSettings = derived("IngestSettings", config.IngestConfig, drop={"source", "root"})
GateSettings = derived("GateSettings", config.ValidateConfig, drop={"root", "run_id", "model_name"})
PushSettings = derived("PushSettings", config.PushConfig, drop={"root", "run_id", "model_name"})
DoctorSettings = derived("DoctorSettings", config.DoctorConfig, drop={"root", "source"})


class Timeouts(BaseModel):
    """Minutes each stage program may run before it is stopped (SIGTERM, then SIGKILL)."""

    model_config = ConfigDict(extra="forbid")

    ingest: float = Field(240, gt=0, description="minutes for the Beam job")
    train: float = Field(24 * 60, gt=0, description="minutes for training (it resumes from its backup on a rerun)")
    validation: float = Field(120, gt=0, description="minutes for TFMA validation")
    push: float = Field(30, gt=0, description="minutes for the push into the model repository")


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
