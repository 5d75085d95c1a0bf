"""Child processes that cannot outlive their welcome: each starts in a process group of its own, so
stopping it also stops whatever it started (Beam workers, TensorFlow's helpers, a Docker client),
every wait has a timeout, and each dies with the process that started it, however that one dies
(SIGKILL and the OOM killer included): a chain of such children (`stoke run`, a stage program, the
TF Serving it checks a model with) ends link by link.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_this_process(signum: int = signal.SIGTERM):
    """A preexec_fn for Popen: the child gets SIGNUM when this process dies, however it dies (SIGKILL
    included), through Linux's PR_SET_PDEATHSIG; None elsewhere. It must be started from the thread
    that lives as long as the process (the kernel watches the thread)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def tie() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # died between the fork and prctl
            os.kill(os.getpid(), signum)
    return tie


def start(command: list[str], **popen) -> subprocess.Popen:
    """Starts `command` as the leader of a new process group (Ctrl-C in a terminal does not reach
    it: the caller decides when it stops, with `stop`), tied to this process (dies_with_this_process,
    unless `preexec_fn` says otherwise): start it from a thread that lives as long as it should."""
    popen.setdefault("preexec_fn", dies_with_this_process())
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True, **popen)


@contextlib.contextmanager
def tied_children() -> Iterator[None]:
    """Every process subprocess.Popen starts in the block is started as `start` starts one, in a session of
    its own and tied to this process: for a library that starts one its own way (Prefect's temporary
    server) and offers no hook. Keep the block to the call that starts it: for its length, Popen is this
    subclass for every thread."""
    plain, tie = subprocess.Popen, dies_with_this_process()

    class Tied(plain):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("preexec_fn", tie)
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    subprocess.Popen = Tied
    try:
        yield
    finally:
        subprocess.Popen = plain


def run(command: list[str], *, timeout: float, env: dict | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs `command` to its end and returns its exit code and text output.

    Raises subprocess.TimeoutExpired after `timeout` seconds, and OSError when it cannot start; the
    process group is stopped in either case, and when this caller is interrupted."""
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        stop(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the whole group, then SIGKILL once `grace` seconds have passed."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
