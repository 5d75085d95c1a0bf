"""One writer at a time in a model repository: push, rollback, retention and partial-push cleanup
take this lock before they look at the repository, and hold it until they are done.

On a local disk it is flock(2) on ROOT/models/<name>/.lock: the kernel drops it when the holder's
process ends, however it ends (the file itself stays; it only records who holds it). Object stores
have no locks, so there it is a lease: an object created only if absent (S3 `If-None-Match: *`, GCS
`ifGenerationMatch=0`, both what fsspec's mode="create" sends) that names its holder and when it
expires. Another process waits for a live holder up to `wait` seconds, then refuses and names it.
A lease past its expiry, or held by a process that no longer exists on this host, is taken over.
The limits, said out loud: a holder that runs past LEASE_SECONDS can be overtaken (`verify` before
a step that makes a version visible catches that), taking over an expired lease is a read, a
delete and a conditional create (two processes taking over in the same instant could both succeed),
and expiry compares clocks of different machines.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import time
import uuid

from components.contracts.files import filesystem, is_local

LEASE_SECONDS = 30 * 60  # longer than any push: the flow gives the push step 30 minutes
WAIT_ENV = "STOKE_LOCK_WAIT_SECONDS"  # how long to wait for another holder (default 300)
POLL_SECONDS = 0.25


class Busy(Exception):
    """Another process holds the lock (or took over an expired lease of ours)."""


def _stamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _record(operation: str, token: str) -> dict:
    now = time.time()
    return {"token": token, "operation": operation, "host": socket.gethostname(), "pid": os.getpid(),
            "acquired_at": _stamp(now), "expires": now + LEASE_SECONDS, "expires_at": _stamp(now + LEASE_SECONDS)}


def _holder(record: dict | None) -> str:
    if not record:
        return "another process"
    return (f"{record.get('operation', 'an operation')} (pid {record.get('pid')} on {record.get('host')}, "
            f"since {record.get('acquired_at')})")


def _gone(record: dict) -> bool:
    """A holder that cannot still be working: its lease expired, or its process is gone from this host."""
    if time.time() > float(record.get("expires", 0)):
        return True
    if record.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(record.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OverflowError):
        return False
    return False


@contextlib.contextmanager
def hold(uri: str, operation: str, wait: float | None = None):
    """Holds the lock at `uri` for the `with` block; yields an object whose verify() raises Busy when
    the lock is no longer ours."""
    if wait is None:
        wait = float(os.environ.get(WAIT_ENV, "300"))
    fs, path = filesystem(uri)
    held = _flock if is_local(fs) else _lease
    with held(fs, path, uri, operation, time.monotonic() + wait, wait) as token:
        yield token


class _Local:
    def verify(self) -> None:
        """flock is held until this process closes the file: nothing can take it away."""


@contextlib.contextmanager
def _flock(fs, path: str, uri: str, operation: str, deadline: float, wait: float):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Busy(f"the model repository is locked by {_holder(_read_local(path))}; waited "
                               f"{wait:.0f} s, try again when it has finished ({uri})") from None
                time.sleep(POLL_SECONDS)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_record(operation, uuid.uuid4().hex)).encode(), 0)
        yield _Local()
    finally:
        os.close(fd)  # releases the lock


def _read_local(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class _Lease:
    def __init__(self, fs, path: str, uri: str, token: str):
        self.fs, self.path, self.uri, self.token = fs, path, uri, token

    def current(self) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None
        except ValueError:
            return {}

    def verify(self) -> None:
        record = self.current()
        if not record or record.get("token") != self.token or time.time() > float(record.get("expires", 0)):
            raise Busy(f"the lease on the model repository ({self.uri}) expired or was taken over by "
                       f"{_holder(record)}: stopping before anything becomes visible to TF Serving")


@contextlib.contextmanager
def _lease(fs, path: str, uri: str, operation: str, deadline: float, wait: float):
    lease = _Lease(fs, path, uri, uuid.uuid4().hex)
    while True:
        try:
            fs.pipe_file(path, json.dumps(_record(operation, lease.token)).encode(), mode="create")
            break
        except FileExistsError:
            record = lease.current()
            if record is None:
                continue  # released between the two requests
            if _gone(record):  # also an unreadable lease, which has no expiry
                if lease.current() == record:  # still the one we judged: take it over
                    fs.rm(path)
                continue
            if time.monotonic() >= deadline:
                raise Busy(f"the model repository is leased by {_holder(record)} until {record.get('expires_at')}; "
                           f"waited {wait:.0f} s. Try again when it has finished; if that process is gone, the "
                           f"lease expires by itself, or delete {uri}") from None
            time.sleep(POLL_SECONDS)
    try:
        yield lease
    finally:
        record = lease.current()
        if record and record.get("token") == lease.token:
            fs.rm(path)
