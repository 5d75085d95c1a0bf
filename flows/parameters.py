"""Typed parameters of the `train` flow, derived from the stage registry.

Each stage declares its settings once (components/contracts/config.py) and its place once
(components/contracts/stages.py); the flow's parameter group of a stage is those settings minus
what the flow decides itself (ROOT, SOURCE, the run id, the model name), and the flow's timeouts
are the registry's. The Prefect UI renders the descriptions as help text.
"""
from __future__ import annotations

import copy
import os
import re
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
# Each with the values it may take: a whole number within bounds (the direct runner's workers and
# threads within this machine's cores: each is a process or thread holding decoded images, and 16
# of them took 4.5 GB for 20 images), or one of a few words. A cloud runner's sizes are bounded
# so one run cannot ask for a fleet.
MAX_CLOUD_WORKERS = 64
_MACHINE_TYPE = r"[a-z][a-z0-9-]{0,62}"
RUN_BEAM_OPTIONS = {
    "direct_num_workers": lambda: (1, os.cpu_count() or 1, "this machine's cores"),
    "direct_running_mode": ("in_memory", "multi_threading", "multi_processing"),
    "num_workers": lambda: (1, MAX_CLOUD_WORKERS, "MAX_CLOUD_WORKERS"),
    "max_num_workers": lambda: (1, MAX_CLOUD_WORKERS, "MAX_CLOUD_WORKERS"),
    "autoscaling_algorithm": ("NONE", "THROUGHPUT_BASED"),
    "machine_type": _MACHINE_TYPE,
    "worker_machine_type": _MACHINE_TYPE,
    "disk_size_gb": lambda: (10, 2000, "2 TB"),
    "number_of_worker_harness_threads": lambda: (1, 4 * (os.cpu_count() or 1), "4 per core of this machine"),
    "parallelism": lambda: (1, MAX_CLOUD_WORKERS, "MAX_CLOUD_WORKERS"),
}
BEAM_ARGS_ENV = "STOKE_BEAM_ARGS"


def check_beam_args(args: list[str]) -> list[str]:
    """The run's Beam options, each `--name=value` with a name from RUN_BEAM_OPTIONS and a value it allows."""
    for arg in args:
        name, _, value = arg.partition("=")
        if not arg.startswith("--") or "=" not in arg or name[2:] not in RUN_BEAM_OPTIONS:
            raise ValueError(f"{name!r} is not an option a run may set; runner, environment and "
                             "credentials belong to the deployment (`stoke up` or `stoke deploy` --beam-args-file). "
                             f"A run may set --NAME=VALUE for: {', '.join(RUN_BEAM_OPTIONS)}")
        problem = _value_problem(RUN_BEAM_OPTIONS[name[2:]], value)
        if problem:
            raise ValueError(f"{arg!r}: {problem}; a run may set {name} only within these bounds")
    return args


def _value_problem(allowed, value: str) -> str | None:
    """Why VALUE is not one ALLOWED admits (bounds, words or a pattern), or None."""
    if callable(allowed):
        low, high, why = allowed()
        if not re.fullmatch(r"[0-9]{1,9}", value) or not low <= int(value) <= high:
            return f"a whole number from {low} to at most {high} ({why}) is needed"
        return None
    if isinstance(allowed, tuple):
        return None if value in allowed else f"one of {', '.join(allowed)} is needed"
    return None if re.fullmatch(allowed, value) else "a machine type such as n1-standard-4 is needed"


BeamArgs = Annotated[list[str], AfterValidator(check_beam_args)]


def read_beam_args(path: str) -> str:
    """A Beam options file such as infra/beam/dataflow.args (one option a line, # comments)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    return " ".join(shlex.quote(line) for line in lines)


# The job variables a flow run may set (work pools): names and labels of what the worker creates,
# its output, how long it waits, and the GPUs a Kubernetes job asks for (bounded by the pool).
# Everything else (command, env, working_dir, image, volumes, networks, service account, the job
# manifest...) belongs to the deployment: `stoke deploy` fixes it in the pool's base job template
# (flows/work_pools.py lock_template), and the flow refuses a run that tries to set it.
OPEN_VARIABLES = frozenset({"name", "labels", "stream_output", "gpus", "finished_job_ttl",
                            "job_watch_timeout_seconds", "pod_watch_timeout_seconds", "auto_remove"})


def check_job_variables(variables: dict) -> None:
    """Refuses a flow run created with job variables outside OPEN_VARIABLES."""
    locked = sorted(set(variables or {}) - OPEN_VARIABLES)
    if locked:
        raise ValueError(f"this run sets the job variables {', '.join(locked)}, which belong to the deployment "
                         "(command, env, image, mounts and accounts are fixed by `stoke deploy`); a run may set "
                         f"only {', '.join(sorted(OPEN_VARIABLES))}")


def run_job_variables() -> dict:
    """The job variables the running flow run was created with; {} outside a flow run."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return {}
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run.id).job_variables or {}


def deployment_beam_args() -> list[str]:
    """The deployment's Beam options: those `stoke deploy` registered with the deployment (its `env`
    job variable, which a run cannot change and the locked pool does not pass on), else those in the
    environment of the process running the flow (`stoke up`'s, or the worker's)."""
    return shlex.split(_registered_env().get(BEAM_ARGS_ENV) or os.environ.get(BEAM_ARGS_ENV, ""))


def _registered_env() -> dict:
    from prefect import get_client
    from prefect.runtime import deployment

    if not deployment.id:
        return {}
    with get_client(sync_client=True) as client:
        return (client.read_deployment(deployment.id).job_variables or {}).get("env") or {}
