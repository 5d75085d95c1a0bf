"""A Beam job that ends in bounded time once a worker has failed, and a process that exits after it.

DirectRunner processes a stage's bundles on a pool of worker threads and waits for all of them.
When one worker fails (a full disk) while another is stuck (a write to a hung network mount, a
read from a stalled bucket), `run()` never returns, and the worker threads are not daemons, so the
interpreter would wait for them at exit too, holding ROOT's lock all the while. Here the job runs
in a daemon thread; once a worker has failed, the driver waits at most GRACE seconds more for the
runner to return, then gives up on it, and `exit_code` ends a process that such threads would keep
alive.

A failure is seen where Beam's SDK worker reports it: it logs every failed bundle on its logger
(whatever the DoFn, ours or Beam's own) and prints the traceback to stderr. The log record is the
signal; the tracebacks are held back unless STOKE_DEBUG is set, so a failure is the one line the
driver writes. Runners in other processes (multi_processing, Flink, Dataflow) report failures
through `run()` itself, and their workers' threads are not ours to wait for.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager

from components.common.quiet_beam import quiet_unless_debugging

GRACE = 60.0  # seconds the runner has to return after a worker failed
# Where apache_beam/runners/worker/sdk_worker.py logs "Error processing instruction ..." for a bundle
# that raised; tests/beam_jobs/test_failed_job.py fails if a Beam upgrade moves it.
SDK_WORKER_LOGGER = "apache_beam.runners.worker.sdk_worker"


# The jobs this process gave up on (StuckRunner): while one is alive, its runner's worker threads,
# which are not daemons, would keep the process from exiting.
_ABANDONED: list[threading.Thread] = []


class StuckRunner(Exception):
    """A worker failed and the runner did not return within the grace period."""


class _Failures(logging.Handler):
    """Notes the first failed bundle's error (the traceback's last line) and wakes the driver, as the job's
    end does too (`wake`)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.wake, self.reason = threading.Event(), None

    def emit(self, record):
        if self.reason is None:
            lines = [line for line in record.getMessage().splitlines() if line.strip()]
            self.reason = lines[-1].strip() if lines else "a worker failed"
        self.wake.set()


def run(job: Callable[[], None]) -> None:
    """Runs `job` (a Beam pipeline run to completion) and re-raises its error; raises StuckRunner
    when the job is still running GRACE seconds after a worker failed."""
    outcome: list[BaseException | None] = []

    def target():
        try:
            job()
            outcome.append(None)
        except BaseException as error:  # handed to the driver's thread
            outcome.append(error)
        finally:
            failures.wake.set()

    with _watching_failures() as failures, quiet_unless_debugging():
        thread = threading.Thread(target=target, name="beam job", daemon=True)
        thread.start()
        failures.wake.wait()  # the job's end, or a worker's failure: then GRACE seconds for the end
        thread.join(GRACE)
    if thread.is_alive():
        _ABANDONED.append(thread)
        raise StuckRunner(f"{failures.reason}; the runner had not stopped {GRACE:.0f} s later and was left behind")
    if outcome[0] is not None:
        raise outcome[0]


def exit_code(code: int) -> int:
    """Returns `code`, or ends the process with it when a job given up on is still running (a stuck
    runner's workers, not daemons): the interpreter would wait for them forever. Only that job's
    threads count: any other thread that is not a daemon belongs to whoever called (a test, a
    program that runs ingest in its own process) and is no reason to end the process. The price of
    os._exit, no atexit handlers or finalizers, is paid after the lock was released and staging
    removed; the streams are flushed here."""
    if code and any(job.is_alive() for job in _ABANDONED):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


@contextmanager
def _watching_failures():
    # The "apache_beam" logger may be silenced (ingest sets it to CRITICAL): this logger gets its own
    # level so the record is made, and does not propagate while the job runs, so it prints nothing.
    logger, failures = logging.getLogger(SDK_WORKER_LOGGER), _Failures()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(failures)
    logger.setLevel(logging.ERROR)
    logger.propagate = bool(os.environ.get("STOKE_DEBUG"))
    try:
        yield failures
    finally:
        logger.removeHandler(failures)
        logger.setLevel(level)
        logger.propagate = propagate
