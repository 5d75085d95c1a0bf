"""One training or gate at a time on this machine's GPUs, held so that it cannot outlive its holder.

The slot is an flock on a file of the user's (STOKE_GPU_LOCK, else gpus.lock in the user's Stoke
folder), taken by the task and inherited by the stage program it starts: the kernel drops the lock
when the last of them exits, so a run killed outright (SIGKILL, an OOM kill, a power cut) frees it at
once, and a stage orphaned by its flow keeps it until it has let go of the GPUs. Prefect's tag
concurrency held the slot in the server instead, where an ephemeral server (`stoke run`) never
revokes an expired lease: one killed run left every later one waiting. And a machine's GPUs are the
machine's: runs on other machines, sharing a Prefect server, do not queue behind each other.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

from components.common.cache_folder import default_folder, secure

GPU_LOCK_ENV = "STOKE_GPU_LOCK"
SAY_EVERY = 60.0  # seconds between "still waiting" lines


@contextlib.contextmanager
def gpu_slot(logger: logging.Logger, holder: str) -> Iterator[int]:
    """Waits for this machine's GPU slot and holds it for the `with` block; yields the lock's file
    descriptor, for the stage program to inherit (Popen's pass_fds)."""
    path = os.environ.get(GPU_LOCK_ENV) or os.path.join(secure(default_folder()), "gpus.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        said = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - said >= SAY_EVERY:
                    logger.info("waiting for the GPUs of this machine: %s has them (%s)", _holder(path), path)
                    said = time.monotonic()
                time.sleep(1.0)
        os.ftruncate(fd, 0)  # the file outlives its holders: it names the current one only
        os.pwrite(fd, json.dumps({"holder": holder, "pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        yield fd
    finally:
        os.close(fd)


def _holder(path: str) -> str:
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read())
        return f"{record['holder']} (pid {record['pid']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another run"
