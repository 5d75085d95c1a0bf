"""TensorFlow's own start-up log, shown only with STOKE_DEBUG set.

Every program that imports TensorFlow prints what its C++ runtime found on the machine: no CUDA driver
(`failed call to cuInit`), cuDNN/cuFFT/cuBLAS factories registered twice, TF-TRT, oneDNN. None of it is
something a user of the run can act on (preflight says what the machine has), and it reaches every
stage's log. Its level is set in the environment a program starts with, before TensorFlow is imported:
the only place it can be set. Lines absl writes before its log is set up ("All log messages before
absl::InitializeLog() ...") ignore the level; flows/programs.py files them under DEBUG.
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
    at FATAL only, unless STOKE_DEBUG is set, when the level the environment gives (TensorFlow's default:
    all of it) is kept."""
    env = dict(os.environ if base is None else base)
    if not debugging():
        env[TF_LOG_LEVEL_ENV] = QUIET_TF_LOG_LEVEL
    return env


def quiet_tensorflow_python() -> None:
    """TensorFlow's Python log (deprecation notices about TensorFlow's own callers, such as TFMA's
    reads of its results) at ERROR, unless STOKE_DEBUG is set."""
    if not debugging():
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
