"""The Beam options a run may set (RunConfig.beam_args): how much of its runner it uses, never which
runner, what it runs or with which credentials."""
from __future__ import annotations

import os
import re
import shlex
from typing import Annotated

from pydantic import AfterValidator

# Beam options a run may set: how much of the runner it uses, never which runner, what it runs or
# with which credentials. Those belong to the deployment (BEAM_ARGS_ENV, set by `stoke up` or
# `stoke deploy --beam-args-file`, read by flows/parameters.py): anyone who can start a run could otherwise pass
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
# The deployment's options, one shell-quoted line (flows/parameters.py read_beam_args): where a runner's
# credentials go, so they reach ingest in its environment, never on its command line, which every local
# user reads in the process list.
BEAM_ARGS_ENV = "STOKE_BEAM_ARGS"


def deployment_options(line: str) -> list[str]:
    """The deployment's Beam options, from BEAM_ARGS_ENV's value. Raises ValueError for a line a shell
    could not split (an unclosed quote)."""
    try:
        return shlex.split(line)
    except ValueError as error:
        raise ValueError(f"{BEAM_ARGS_ENV}: {error}; it holds the deployment's Beam options, "
                         "one shell-quoted line (`stoke up` or `stoke deploy` --beam-args-file)") from None


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
