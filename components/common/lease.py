"""One writer at a time: an flock on a local disk, a lease object on a bucket, behind one interface.

    with exclusive(uri, "ingest", wait=60) as lease:   # waits up to 60 s for a live holder, then LeaseHeld
                                                        # (`waiting` is told once, when it starts to wait)
        ...             # long work: a bucket lease renews itself in the background
        lease.check()   # just before publishing: raises LeaseLost when another writer has taken over

Both name their holder (purpose, pid, host), so a refusal can say who to wait for. On a local disk
the kernel holds the lock and drops it when the process dies, so it never expires; the file records
who holds it.
Object stores have no locks. There the lease is an object created only if absent (S3
`If-None-Match: *`, GCS `ifGenerationMatch=0`) and rewritten every TTL/4 by its holder only if
unchanged (S3 `If-Match: <ETag>`, GCS `ifGenerationMatch=<generation>`). Once it has gone TTL
without renewal, the next writer takes it over with the same kind of conditional write, so a holder
that died blocks the others for at most TTL and a second. Its age is read on the store's clock on S3
(last modified against the response's Date, both in whole seconds, so counted a second younger), on
the local clock against the object's update time on GCS. A holder that cannot renew for TTL/2 (a
frozen VM, a store that is away), counted from when it sent its last renewal, counts its lease as
lost: `check()` refuses, and the work publishes nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from components.common.files import filesystem, is_local, protocol

TTL = 120.0  # seconds a lease outlives its last renewal
# Seconds between tries while waiting for a holder: at first a quarter second, so a short wait ends as soon
# as the holder lets go, then twice as long each try up to MAX_POLL, so an hour behind a long ingest costs a
# bucket some thousand requests, not fourteen thousand.
POLL, MAX_POLL = 0.25, 5.0


class LeaseError(Exception):
    """The lease cannot be taken or kept; the message says why."""


class LeaseHeld(LeaseError):
    """Another writer holds the lease; `holder` says who, when the store says so."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder


class LeaseLost(LeaseError):
    """The lease lapsed or passed to another writer while this one worked."""


@contextlib.contextmanager
def exclusive(uri: str, purpose: str, ttl: float = TTL, wait: float = 0.0,
              waiting: Callable[[LeaseHeld], None] | None = None, own: bool = False) -> Iterator[_Flock | _ObjectLease]:
    """Holds the lease at `uri` (a file or an object, created when absent) for the `with` block,
    waiting up to `wait` seconds for a live holder to finish; `waiting` gets the first refusal, once,
    when there is a wait ahead. A lease object goes when let go; a lock file stays for the next writer,
    unless the lease is the holder's `own`, which no other writer takes (others only look: `held`)."""
    fs, path = filesystem(uri)
    scheme = protocol(fs)
    if is_local(fs):
        lease = _Flock(path, purpose, remove=own)
    elif scheme in ("s3", "s3a"):
        lease = _ObjectLease(uri, _S3(fs, path), purpose, ttl)
    elif scheme in ("gs", "gcs"):
        lease = _ObjectLease(uri, _GCS(path), purpose, ttl)
    else:
        raise LeaseError(f"no lease on {scheme}:// ({uri}): use a local path, s3:// or gs://")
    deadline, pause = None, POLL
    while True:
        try:
            lease.acquire()
            break
        except LeaseHeld as held:
            # The wait counts from the first refusal: a slow store may take longer to answer than the whole wait.
            if deadline is None:
                if wait <= 0:
                    raise
                deadline = time.monotonic() + wait
                if waiting is not None:
                    waiting(held)
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(pause, left))
            pause = min(pause * 2, MAX_POLL)
    try:
        yield lease
    finally:
        lease.release()


def held(uri: str) -> bool | None:
    """Whether a live holder holds the lease at `uri` now, as one look sees it: True; False when it is free
    (let go, or its holder died: an flock the kernel dropped, an object not renewed for its ttl); None when
    there is no lease there. Looks only: it creates nothing, and holds the lock it tries for an instant, shared,
    so a holder that takes the lease at that instant waits the moment out (`exclusive`'s `wait`)."""
    fs, path = filesystem(uri)
    if is_local(fs):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # drops the shared lock with the descriptor
        return False
    scheme = protocol(fs)
    store = _S3(fs, path) if scheme in ("s3", "s3a") else _GCS(path) if scheme in ("gs", "gcs") else None
    if store is None:
        raise LeaseError(f"no lease on {scheme}:// ({uri}): use a local path, s3:// or gs://")
    found = store.read()
    if found is None:
        return None
    meta, _, age = found
    return age < float(meta.get("ttl", TTL))


def _identity(purpose: str) -> dict:
    return {"holder": f"pid {os.getpid()} on {socket.gethostname()}", "purpose": purpose}


def _who(meta: dict) -> str:
    """A holder's record as 'push (pid 12 on host-a)'; '' when it names nobody."""
    holder, purpose = meta.get("holder", ""), meta.get("purpose", "")
    return f"{purpose} ({holder})" if holder and purpose else holder


class _Flock:
    def __init__(self, path: str, purpose: str, remove: bool = False):
        self.path, self.record, self.remove = path, json.dumps(_identity(purpose)).encode(), remove

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            holder = _who(self._read())
            raise LeaseHeld(f"{holder or 'another process'} holds {self.path}", holder) from None
        try:
            os.ftruncate(self.fd, 0)  # the file outlives its holders: it names the current one only
            os.pwrite(self.fd, self.record, 0)
        except OSError as error:  # a full disk: let go, and named as a file that cannot be written is
            self.release()
            raise OSError(error.errno, error.strerror, self.path) from None

    def _read(self) -> dict:
        try:
            with open(self.path, "rb") as f:
                record = json.loads(f.read())
        except (OSError, ValueError):  # written by hand, or read between truncate and write
            return {}
        return record if isinstance(record, dict) else {}

    def check(self) -> None:
        """An flock cannot lapse while its process lives."""

    def release(self) -> None:
        if self.remove:  # a lease only its holder ever takes: no other writer can be waiting on this file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self.fd)  # drops the lock


class _ObjectLease:
    def __init__(self, uri: str, store, purpose: str, ttl: float):
        self.uri, self.store, self.ttl = uri, store, ttl
        self.meta = {**_identity(purpose), "ttl": str(ttl),
                     "token": uuid.uuid4().hex}  # the token tells two holders on one host apart
        self.body = json.dumps(self.meta).encode()
        self.stop, self.lost = threading.Event(), ""

    def acquire(self) -> None:
        for _ in range(3):  # the lease may be released or taken by another between two requests
            sent = time.monotonic()  # the store dates the lease no earlier than this
            tag = self.store.create(self.body, self.meta)
            if tag is None:
                found = self.store.read()
                if found is None:
                    continue
                meta, current, age = found
                ttl = float(meta.get("ttl", self.ttl))
                holder = _who(meta) or "another writer"
                if age < ttl:
                    raise LeaseHeld(f"{holder} holds {self.uri}, renewed {age:.0f} s ago; it lapses {ttl:.0f} s "
                                    "after the last renewal", holder)
                tag = self.store.replace(self.body, self.meta, current)  # lapsed: take it over
                if tag is None:
                    continue
            self.tag, self.renewed = tag, sent
            self.thread = threading.Thread(target=self._renew, name=f"lease {self.uri}", daemon=True)
            self.thread.start()
            return
        raise LeaseHeld(f"{self.uri} changed hands while this writer tried to take it")

    def _renew(self) -> None:
        while not self.stop.wait(self.ttl / 4):
            sent = time.monotonic()
            try:
                tag = self.store.replace(self.body, self.meta, self.tag)
            except Exception:  # the store is briefly away: try again; check() decides when it is too long
                continue
            if tag is None:
                self.lost = "another writer took it over"
                return
            self.tag, self.renewed = tag, sent

    def check(self) -> None:
        unrenewed = time.monotonic() - self.renewed
        if self.lost or unrenewed > self.ttl / 2:
            raise LeaseLost(f"lost the lease {self.uri}: {self.lost or f'not renewed for {unrenewed:.0f} s'}")

    def release(self) -> None:
        self.stop.set()
        # A renewal stuck on an unanswering store must not hold the process: the lease then lapses
        # after its ttl instead (the delete below is conditional on the tag the renewal may change).
        self.thread.join(timeout=self.ttl / 4)
        if not self.lost:
            self.store.delete(self.tag)  # conditional: never removes a lease another writer took over


class _S3:
    """Conditional writes through s3fs's client, so the lease sees the credentials and endpoint the data does."""

    def __init__(self, fs, path: str):
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(path)

    def create(self, body: bytes, meta: dict) -> str | None:
        return self._put(body, meta, IfNoneMatch="*")

    def replace(self, body: bytes, meta: dict, tag: str) -> str | None:
        return self._put(body, meta, IfMatch=tag)

    def _put(self, body: bytes, meta: dict, **condition) -> str | None:
        try:
            return self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=body, Metadata=meta,
                                   **condition)["ETag"]
        except OSError as error:
            if _refused(error):
                return None
            raise

    def read(self) -> tuple[dict, str, float] | None:
        try:
            head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self.key)
        except FileNotFoundError:
            return None
        now = parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"])
        # Both dates are HTTP dates, in whole seconds (RFC 9110 5.6.7): the lease may be up to a
        # second younger than their difference, never older, so it is counted a second younger.
        age = (now - head["LastModified"]).total_seconds() - 1.0
        return head.get("Metadata", {}), head["ETag"], max(age, 0.0)

    def delete(self, tag: str) -> None:
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=tag)
        except OSError as error:
            if not _refused(error):
                raise


def _refused(error: OSError) -> bool:
    """A condition that did not hold (412), a concurrent conditional write (409) or a missing object."""
    if isinstance(error, (FileExistsError, FileNotFoundError)):
        return True
    response = getattr(error.__cause__, "response", None) or {}
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (404, 409, 412)


class _GCS:
    """Generation preconditions through google-cloud-storage (installed with apache-beam[gcp])."""

    def __init__(self, path: str):
        from google.cloud import storage

        bucket, _, self.name = path.partition("/")
        self.bucket = storage.Client().bucket(bucket)

    def create(self, body: bytes, meta: dict) -> str | None:
        return self._upload(body, meta, 0)

    def replace(self, body: bytes, meta: dict, tag: str) -> str | None:
        return self._upload(body, meta, int(tag))

    def _upload(self, body: bytes, meta: dict, generation: int) -> str | None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self.bucket.blob(self.name)
        blob.metadata = meta
        try:
            blob.upload_from_string(body, content_type="application/json", if_generation_match=generation)
        except (NotFound, PreconditionFailed):
            return None
        return str(blob.generation)

    def read(self) -> tuple[dict, str, float] | None:
        blob = self.bucket.get_blob(self.name)
        if blob is None:
            return None
        return blob.metadata or {}, str(blob.generation), (datetime.now(UTC) - blob.updated).total_seconds()

    def delete(self, tag: str) -> None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        with contextlib.suppress(NotFound, PreconditionFailed):
            self.bucket.blob(self.name).delete(if_generation_match=int(tag))
