"""Running a stage program (`python -m module --config FILE --json`) from a task: its own process, a real timeout,
its output streamed into the run log, its progress events handed on, its JSON summary read from the
last line of stdout.

A subprocess, not an import, because that is how a Dataflow job or a Kubernetes Job starts the same
program: it frees all GPU memory when it exits, a segfault in a native library fails one task and
not the flow, and a timeout can kill it (and every process it started) for certain.
"""
from __future__ import annotations

import json
import logging
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from components.common import processes
from components.common.program import BAD_SETTINGS, TRANSIENT, escape_logs, printable
from components.common.runtime_logs import program_environment, tensorflow_lines_asked
from components.contracts.results import ResultError
from components.contracts.summaries import Progress, event

# After SIGTERM a stage gets this long to save what it can (the trainer's backup) before SIGKILL.
KILL_GRACE_SECONDS = 10.0
TAIL_LINES = 20

# File names reach every log line of a run (a stage's command line, a source in a message): Prefect's
# run loggers escape control and format characters in every message, whoever logs it.
escape_logs("prefect.flow_runs", "prefect.task_runs")


class StageError(RuntimeError):
    """A stage program that failed, timed out or printed no summary; the message says which. `reason`
    is the program's own one-line error, `transient` whether another try may succeed: the program
    said so (exit code 75, components/common/program.py) or a signal ended it; and `settings` whether
    the program refused its settings (exit code 2), which `stoke run` exits with in turn."""

    def __init__(self, message: str, summary: dict | None = None, timed_out: bool = False, *, stage: str = "",
                 reason: str = "", transient: bool = False, settings: bool = False):
        super().__init__(printable(message))  # shown by Prefect's state messages and tracebacks
        self.summary, self.timed_out = summary, timed_out
        self.stage, self.reason, self.transient, self.settings = stage, printable(reason), transient, settings

    def __reduce__(self):  # a pickled copy (Prefect may persist a failed state's exception) keeps what retries read
        return _restored, (type(self), self.args[0], self.__dict__)

    @property
    def line(self) -> str:
        """The stage and its own one-line error, as `stoke run` ends with it."""
        return f"{self.stage}: {self.reason}" if self.stage and self.reason else str(self)


def _restored(kind: type[StageError], message: str, state: dict) -> StageError:
    error = kind.__new__(kind)
    error.args = (message,)
    error.__dict__.update(state)
    return error


def run_stage(name: str, module: str, argv: list[str], *, timeout: float, logger: logging.Logger,
              progress: Callable[[Progress], None] | None = None, env: dict | None = None,
              pass_fds: tuple[int, ...] = ()) -> dict:
    """Runs `python -m module argv` and returns the JSON object on its last stdout line.

    Progress events (JSON lines of stdout with an "event" key, components/contracts/results.py) go to
    `progress`, if given, and are never the summary. Every other line goes to `logger` as it arrives
    (stdout at INFO, stderr at INFO too: Beam and TensorFlow write their own progress there), but for
    the program's own error line (`stoke NAME: ...` on stderr, last before a failed exit), which goes at
    DEBUG: the StageError raised carries it, and whoever reports the failure says it once. Raises
    StageError on a non-zero exit, on timeout (after killing the whole process group) or without a summary.
    The program's temporary folder (TMPDIR) is its own, removed once it ended, however it ended."""
    command = [sys.executable, "-m", module, *argv]
    logger.info("%s: %s", name, " ".join(command[1:]))
    lines: queue.Queue = queue.Queue()
    # The program's temporary folder (TMPDIR), removed once it ended: a program removes its own as it exits
    # (components/common/program.py), but one killed outright (a timeout's SIGKILL, the OOM killer) cannot.
    scratch = tempfile.TemporaryDirectory(prefix=f"stoke-{name}-", ignore_cleanup_errors=True)
    process = _started(command, lines, {**(env or {}), "TMPDIR": scratch.name}, pass_fds)
    deadline = time.monotonic() + timeout
    last_json, tail, said, open_streams = None, [], None, 2  # said: the last line on stderr
    own = f"stoke {name}: "
    # The program's own failure line (`stoke NAME: error: ...`, preflight's `stoke preflight: CHECK failed: ...`) is
    # the StageError's reason, which `stoke run` prints last: it is held until the program's next line on stderr
    # shows it was not its last, and filed at DEBUG when the program then fails. Only stderr releases it: the two
    # streams are read on two threads, so a stdout line may arrive after a stderr line printed after it.
    held: list[str] = []

    def log_held(level: int = logging.INFO) -> None:
        for line in held:
            logger.log(level, "%s: %s", name, printable(line))
        held.clear()

    try:
        while open_streams:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                processes.stop(process, KILL_GRACE_SECONDS)
                why = f"timed out after {timeout:,.0f} s and was stopped; last output: {' | '.join(tail[-3:]) or 'none'}"
                raise StageError(f"{name} {why}", timed_out=True, stage=name, reason=why)
            try:
                tag, line = lines.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
                continue
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if tag == "out" and line.lstrip().startswith("{"):
                logger.debug("%s: %s", name, line)
                if not _progress_event(name, line, logger, progress):
                    last_json = line  # a summary candidate: the last one printed wins
                continue
            if tag == "err":
                log_held()
            tail = (tail + [line])[-TAIL_LINES:]
            said = line if tag == "err" else said
            if tag == "err" and line.startswith(own) and (line.startswith(own + "error: ") or " failed: " in line):
                held.append(line)
                continue
            logger.log(_level(line), "%s: %s", name, printable(line))
        code = process.wait(timeout=max(deadline - time.monotonic(), 1.0))
    except BaseException:
        log_held()
        # Cancelled, timed out or interrupted: never leave a trainer holding the GPU behind us.
        processes.stop(process, KILL_GRACE_SECONDS)
        raise
    finally:
        scratch.cleanup()
    log_held(logging.DEBUG if code != 0 else logging.INFO)

    summary = _parse(last_json)
    if code != 0:
        raise _failed(name, code, summary, said or (tail[-1] if tail else None))
    if summary is None:  # a program that breaks its contract does so every time: not retried
        raise StageError(f"{name} exited 0 but printed no JSON summary as its last line", stage=name,
                         reason="exited 0 but printed no JSON summary as its last line")
    return summary


def _started(command: list[str], lines: queue.Queue, env: dict | None, pass_fds: tuple[int, ...]):
    """The program started, its stdout and stderr pumped into `lines` as ("out" | "err", line) pairs.
    In its own process group, so Beam's worker processes and TensorFlow's children stop with it; and it
    stops when this process dies, however it dies: nothing would read its output, and it may hold the
    GPUs (`pass_fds`: the GPU slot it inherits)."""
    process = processes.start(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, pass_fds=pass_fds,
        env={**program_environment(), "PYTHONUNBUFFERED": "1", **(env or {})})
    for stream, tag in ((process.stdout, "out"), (process.stderr, "err")):
        threading.Thread(target=_pump, args=(stream, tag, lines), daemon=True).start()
    return process


def _failed(name: str, code: int, summary: dict | None, last: str | None) -> StageError:
    """The StageError of a program that exited `code`. Its reason is its own error line (the summary's
    `error`), else its `last` line of output, stderr's first (a crash's exception, never a traceback's
    middle). Transient when it exited TRANSIENT, or when a signal ended it: the OOM killer choosing among
    a shared machine's processes, an operator or a preemption stopped it, not its input, and every
    retried stage is safe to run again (ingest publishes exactly once, push finishes what a kill left undone)."""
    if code < 0:
        reason = f"killed by {_signal_name(-code)}" + (f"; last output: {last}" if last else "")
    else:
        reason = (summary or {}).get("error") or last or f"exit code {code}"
    return StageError(f"{name} failed (exit code {code}): {reason}", summary, stage=name, reason=reason,
                      transient=code == TRANSIENT or code < 0, settings=code == BAD_SETTINGS)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal, which the enum does not name
        return f"signal {number}"


# TensorFlow's C++ logging (absl): "I0000 00:00:... port.cc:153] ...". Its info and warning lines
# (oneDNN, "no CUDA drivers") say nothing about the run; keep them out of the run log's INFO view, unless
# STOKE_DEBUG or the user's TF_CPP_MIN_LOG_LEVEL asks for them (components/common/runtime_logs.py keeps the
# rest from being printed at all).
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d")


def _level(line: str) -> int:
    if tensorflow_lines_asked():
        return logging.INFO
    match = _ABSL_LINE.match(line)
    if match:
        return logging.DEBUG if match.group(1) in "IW" else logging.INFO
    if line.startswith("WARNING: All log messages before absl::InitializeLog()"):
        return logging.DEBUG
    return logging.INFO


def _progress_event(name: str, line: str, logger: logging.Logger,
                    progress: Callable[[Progress], None] | None) -> bool:
    """Hands the event a line holds to `progress`; False for a line that is no event (a summary candidate)."""
    try:
        found = event(line)
    except ResultError as error:  # an event from a newer program, say: no reason to stop the stage
        logger.warning("%s: %s", name, error)
        return True
    if found is not None and progress:
        progress(found)
    return found is not None


def _pump(stream, tag: str, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put((tag, line))
    stream.close()
    lines.put((tag, None))


def _parse(line: str | None) -> dict | None:
    if line is None:
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
