"""Beam's own log and its workers' tracebacks, shown only with STOKE_DEBUG set.

A program that runs a Beam pipeline ends with one line of its own saying what failed. Beam logs every
failed bundle on its loggers, traceback included, and its worker threads print tracebacks to
sys.stderr besides, whatever the logging: both would reach the run's log around that line.
"""
from __future__ import annotations

import io
import logging
import os
import sys
from contextlib import contextmanager

DEBUG_ENV = "STOKE_DEBUG"


def debugging() -> bool:
    return bool(os.environ.get(DEBUG_ENV))


@contextmanager
def quiet_unless_debugging():
    """Within the block, Beam's loggers keep only CRITICAL and sys.stderr goes to a buffer, unless
    STOKE_DEBUG is set. Progress lines are unaffected: their printer holds the stream it was made with;
    so are loggers given a level of their own (beam_jobs/bounded.py watches the SDK worker's)."""
    if debugging():
        yield
        return
    beam = logging.getLogger("apache_beam")
    level, saved = beam.level, sys.stderr
    beam.setLevel(logging.CRITICAL)
    sys.stderr = io.StringIO()
    try:
        yield
    finally:
        sys.stderr = saved
        beam.setLevel(level)
