"""flows/programs.py: stage programs as subprocesses, their output streamed, their summary read."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import tempfile

import pytest

import components.train  # noqa: F401  (as many test modules do when collected: it sets TF_USE_LEGACY_KERAS)
from components.contracts.summaries import Progress
from flows.programs import StageError, run_stage
from tests.waiting import wait_for

PROGRAM = "tests.flows.stage_program"


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))


@pytest.fixture
def logger():
    logger = logging.getLogger("test-stages")
    logger.setLevel(logging.DEBUG)
    handler = Lines()
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)


def test_streams_every_line_and_returns_the_last_json_line(logger, tmp_path):
    log, lines = logger
    seen = []
    summary = run_stage("fake", PROGRAM, ["ok", str(tmp_path / "pid")], timeout=60, logger=log, progress=seen.append)
    assert summary == {"done": True, "mode": "ok"}
    messages = [message for level, message in lines.records if level == logging.INFO]
    assert "fake: starting" in messages and "fake: a line on stderr" in messages
    assert "fake: Epoch 1/2" in messages
    assert seen == [Progress(stage="fake", done=done, total=2, unit="epochs", seconds=0.5) for done in (1, 2)]


def test_a_failing_stage_raises_with_its_own_error_message(logger, tmp_path):
    with pytest.raises(StageError, match=r"fake failed \(exit code 3\): the source is empty") as raised:
        run_stage("fake", PROGRAM, ["fail", str(tmp_path / "pid")], timeout=60, logger=logger[0])
    assert raised.value.summary == {"error": "the source is empty"}


@pytest.mark.parametrize("mode,transient,reason", [
    ("fail", False, "the source is empty"),
    ("transient", True, "cannot reach S3 for bucket b (Connection reset by peer)"),
    ("killed", True, "killed by SIGKILL; last output: a line on stderr"),
    ("crash", False, "RuntimeError: a bug's traceback: its last line is the reason"),
])
def test_a_failed_stage_says_its_own_line_and_whether_a_retry_may_help(logger, tmp_path, mode, transient, reason):
    """The program's own error, or its last line (a crash's exception, never a traceback's middle);
    transient when it exited 75 or a signal ended it."""
    with pytest.raises(StageError) as raised:
        run_stage("fake", PROGRAM, [mode, str(tmp_path / "pid")], timeout=60, logger=logger[0])
    assert (raised.value.transient, raised.value.reason, raised.value.line) == (transient, reason, f"fake: {reason}")
    copy = pickle.loads(pickle.dumps(raised.value))  # as Prefect may keep a failed state's exception
    assert (type(copy), str(copy), copy.transient, copy.line) == (StageError, str(raised.value), transient, f"fake: {reason}")


@pytest.mark.parametrize("mode,runs", [("transient", 3), ("killed", 3), ("fail", 1), ("crash", 1)])
def test_only_transient_failures_are_retried(tmp_path, mode, runs):
    """The flow's retry condition on a real task run: a stage that says its failure was transient is
    run again, a deterministic failure once."""
    from prefect import flow, task

    from flows.pipeline import only_transient

    @task(retries=2, retry_delay_seconds=0, retry_condition_fn=only_transient)
    def stage():
        return run_stage("fake", PROGRAM, [mode, str(tmp_path / "pid")], timeout=60, logger=logging.getLogger("x"))

    @flow
    def one_stage():
        stage()

    assert one_stage(return_state=True).is_failed()
    assert (tmp_path / "pid.runs").read_text().splitlines() == [mode] * runs


def test_a_stage_that_ran_out_of_time_is_not_retried():
    from prefect.states import Failed

    from flows.pipeline import only_transient

    assert not only_transient(None, None, Failed(data=StageError("fake timed out", timed_out=True, stage="fake")))
    assert only_transient(None, None, Failed(data=StageError("fake failed", stage="fake", transient=True)))


@pytest.fixture
def temporary(tmp_path, monkeypatch):
    """The temporary folder of this process, fresh."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return folder


def test_a_timeout_kills_the_stage_and_the_processes_it_started(logger, tmp_path, temporary):
    pidfile = tmp_path / "pid"
    with pytest.raises(StageError, match="timed out"):
        run_stage("fake", PROGRAM, ["hang", str(pidfile)], timeout=5, logger=logger[0])
    grandchild = int(pidfile.read_text())
    wait_for(lambda: not _alive(grandchild), "the grandchild to be reaped by init", 10, every=0.1)
    assert list(temporary.iterdir()) == []  # what it left in its temporary folder went with it


@pytest.mark.parametrize("mode", ["ok", "fail", "killed", "crash"])
def test_what_a_stage_leaves_in_its_temporary_folder_goes_when_it_ends_however_it_ends(logger, tmp_path, temporary,
                                                                                       mode):
    """Each program runs with a temporary folder of its own, removed once it ended: one killed outright (SIGKILL,
    the OOM killer) could not remove what it put there."""
    with pytest.raises(StageError) if mode != "ok" else contextlib.nullcontext():
        run_stage("fake", PROGRAM, [mode, str(tmp_path / "pid")], timeout=60, logger=logger[0])
    assert list(temporary.iterdir()) == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_programs_own_error_line_is_said_once_by_the_failure(logger, tmp_path):
    """The program's `stoke NAME: error: ...` line is the StageError's reason, which `stoke run` prints as its
    last line: the run log keeps the line at DEBUG, not once more among the stage's output. Its other own
    lines are output like any other."""
    log, lines = logger
    with pytest.raises(StageError) as raised:
        run_stage("fake", PROGRAM, ["own-error", str(tmp_path / "pid")], timeout=60, logger=log)
    assert raised.value.line == "fake: the source is empty"
    shown = [message for level, message in lines.records if level >= logging.INFO]
    assert "fake: stoke fake: checked 2 shards" in shown and "fake: Epoch 2/2" in shown
    assert not [message for message in shown if "the source is empty" in message], shown
    assert (logging.DEBUG, "fake: stoke fake: error: the source is empty") in lines.records


@functools.cache
def tensorflow_stage(debug: bool, level: str | None = None) -> tuple[list[tuple[int, str]], dict]:
    """The records logged and the summary returned by a stage program that starts TensorFlow (a process
    importing it costs seconds of CPU), run once per module for each STOKE_DEBUG and TF_CPP_MIN_LOG_LEVEL
    (None: not set by the user): the tests below read the same run. Called from a test, after the session's
    environment was restored for it."""
    log, lines = logging.getLogger(f"test-tensorflow-stage-{debug}-{level}"), Lines()
    log.setLevel(logging.DEBUG)
    log.addHandler(lines)
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        patch.delenv("STOKE_DEBUG", raising=False)
        patch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
        if debug:
            patch.setenv("STOKE_DEBUG", "1")
        if level is not None:
            patch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
        summary = run_stage("fake", PROGRAM, ["tensorflow", os.path.join(folder, "pid")], timeout=300, logger=log)
    log.removeHandler(lines)
    return lines.records, summary


@pytest.mark.parametrize("debug, level, shown", [(False, None, False), (True, None, True), (False, "0", True)])
def test_tensorflows_start_up_log_is_for_stoke_debug_or_the_users_own_level(debug, level, shown):
    """What TensorFlow's runtime says as it starts (no CUDA driver, oneDNN...) is not a line of the run;
    STOKE_DEBUG=1 shows it, and so does a TF_CPP_MIN_LOG_LEVEL of the user's own that asks for it
    (`TF_CPP_MIN_LOG_LEVEL=0 stoke run ...`): Stoke sets the level only when the user has not."""
    import re

    records, _ = tensorflow_stage(debug, level)
    said = [message for at, message in records if at >= logging.INFO]
    runtime = [message for message in said if re.match(r"fake: ([IWEF]\d{4} |WARNING: All log messages)", message)]
    assert bool(runtime) == shown, said


def test_a_stage_program_gets_no_keras_setting_from_a_test_that_imported_training():
    """Importing components.train sets TF_USE_LEGACY_KERAS in the importing process (for the trainer's own
    TensorFlow); in the test process, where many test modules import it, it must not reach the programs
    other tests start, as it never reaches them from `stoke run`."""
    _, summary = tensorflow_stage(False)
    assert summary == {"legacy_keras": None}
