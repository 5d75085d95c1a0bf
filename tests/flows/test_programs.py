"""flows/programs.py: stage programs as subprocesses, their output streamed, their summary read."""
from __future__ import annotations

import logging

import pytest

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


def test_a_timeout_kills_the_stage_and_the_processes_it_started(logger, tmp_path):
    pidfile = tmp_path / "pid"
    with pytest.raises(StageError, match="timed out"):
        run_stage("fake", PROGRAM, ["hang", str(pidfile)], timeout=5, logger=logger[0])
    grandchild = int(pidfile.read_text())
    wait_for(lambda: not _alive(grandchild), "the grandchild to be reaped by init", 10, every=0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
