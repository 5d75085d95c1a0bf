"""TensorFlow's own start-up log, shown only with STOKE_DEBUG set or a level of the user's own.

Every program that imports TensorFlow prints what its C++ runtime found on the machine: no CUDA driver
(`failed call to cuInit`), cuDNN/cuFFT/cuBLAS factories registered twice, TF-TRT, oneDNN. None of it is
something a user of the run can act on (preflight says what the machine has), and it reaches every
stage's log. Its level is set in the environment a program starts with, before TensorFlow is imported:
the only place it can be set, and only when the user has not set it: `TF_CPP_MIN_LOG_LEVEL=0 stoke run ...`
shows all of it. Lines absl writes before its log is set up ("All log messages before
absl::InitializeLog() ...") ignore the level; flows/programs.py files them under DEBUG unless the level
asks for them.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from components.common.quiet_beam import debugging

TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
# FATAL only: a real error in TensorFlow still reaches the program as a Python exception, which the
# program turns into its own error line; ERROR lines are start-up findings such as cuInit's.
QUIET_TF_LOG_LEVEL = "3"


def program_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) for a program started from here: TensorFlow's C++ log
    at the level the environment gives, or else at FATAL only, unless STOKE_DEBUG is set (TensorFlow's
    default then: all of it)."""
    env = dict(os.environ if base is None else base)
    if not debugging():
        env.setdefault(TF_LOG_LEVEL_ENV, QUIET_TF_LOG_LEVEL)
    return env


def tensorflow_lines_asked() -> bool:
    """Whether TensorFlow's info and warning lines belong in the run's log: STOKE_DEBUG is set, or the user's
    TF_CPP_MIN_LOG_LEVEL asks for them (0 or 1)."""
    return debugging() or os.environ.get(TF_LOG_LEVEL_ENV, QUIET_TF_LOG_LEVEL).strip() in ("0", "1")


def quiet_tensorflow_python() -> None:
    """TensorFlow's Python log (deprecation notices about TensorFlow's own callers, such as TFMA's
    reads of its results) at ERROR, unless STOKE_DEBUG is set."""
    if not debugging():
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
