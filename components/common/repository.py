"""ROOT/models/<name>/: the TensorFlow Serving model repository, and the only code that changes it.

TF Serving loads every integer-named folder it finds, possibly while a copy is still running, so a
version appears in one step: on file systems it is written under a non-integer temp name and
renamed; object stores have no rename, so `saved_model.pb` (what the server needs to load
anything) is copied last and a folder without it is a partial version, cleaned up before each change.
A version number is reserved by an operation that fails when it is taken (creating the temp
folder `.push-<version>`; on object stores, creating the lineage file only if absent), so two
pushes never share a number or nest one model inside another.
Versions taken out are never deleted by rollback: they are moved to `rolled-back-<version>`.
Retention deletes old versions (saved_model.pb first) but keeps their lineage in `_retired/<version>.json`.
Whatever changes the repository runs inside `lock()`: the lease ingest also uses
(components/common/lease.py), an flock on a local disk and a self-renewing lease object on a bucket.
"""
from __future__ import annotations

import contextlib
import os
import posixpath
import re
import signal
import time

from components.common.files import filesystem, is_local, join, read_json, write_json
from components.common.lease import TTL, LeaseError, LeaseHeld, LeaseLost, exclusive
from components.contracts.config import MODEL_NAME_PATTERN
from components.contracts.layout import Root
from components.contracts.lineage import Lineage

SAVED_MODEL = "saved_model.pb"
ASSETS_EXTRA = "assets.extra"
LINEAGE_FILE = "stoke_lineage.json"
ROLLED_BACK_PREFIX = "rolled-back-"
RETIRED = "_retired"
TEMP_PREFIX = ".push-"
LOCK_FILE = ".lock"
WAIT_ENV = "STOKE_LOCK_WAIT_SECONDS"  # how long lock() waits for another holder (default 300)
# Fault drill: with this set to N, the push process kills itself (SIGKILL) after copying N files,
# the way a preempted machine stops mid-copy.
KILL_AFTER_FILES_ENV = "STOKE_KILL_AFTER_FILES"
# The kill drill of a push's later steps: SIGKILL right after the named step (tests only).
KILL_AFTER_STEP_ENV = "STOKE_KILL_AFTER_STEP"
KILL_STEPS = ("published", "recorded", "retired")


def kill_drill(step: str) -> None:
    if os.environ.get(KILL_AFTER_STEP_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


class RepositoryError(Exception):
    """A refusal with a message for the user."""


def check_model_name(name: str) -> str:
    if not re.fullmatch(MODEL_NAME_PATTERN, name or ""):
        raise RepositoryError(f"model name {name!r} may hold only letters, digits, '-' and '_' (at most 64)")
    return name


class Repository:
    """One model's folder of integer versions."""

    def __init__(self, root: Root | str, name: str):
        self.root = root if isinstance(root, Root) else Root(root)
        self.name = check_model_name(name)
        self.uri = self.root.models(name)
        self.fs, self.path = filesystem(self.uri)
        self._held = None  # the lock while this object holds it

    @contextlib.contextmanager
    def lock(self, operation: str, wait: float | None = None, ttl: float = TTL):
        """Holds the repository's lock for the `with` block; refuses with a RepositoryError naming the
        holder when another process keeps it longer than `wait` seconds (default: $STOKE_LOCK_WAIT_SECONDS
        or 300). On a bucket the lease lapses `ttl` seconds after its holder last renewed it."""
        if wait is None:
            wait = float(os.environ.get(WAIT_ENV, "300"))
        try:
            with exclusive(join(self.uri, LOCK_FILE), operation, ttl=ttl, wait=wait) as held:
                self._held = held
                try:
                    yield self
                finally:
                    self._held = None
        except LeaseHeld as busy:
            raise RepositoryError(f"{operation} of {self.name}: {busy}; waited {wait:g} s, "
                                  "try again when it has finished") from None
        except LeaseError as error:
            raise RepositoryError(f"{operation} of {self.name}: {error}") from None

    def _locked(self, what: str) -> None:
        if self._held is None:
            raise RepositoryError(f"{what} changes {self.uri} and must run inside Repository.lock()")

    # ------------------------------------------------------------------ reading

    def _entries(self) -> list[str]:
        if not self.fs.isdir(self.path):
            return []
        return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.path, detail=False)]

    def _complete(self, name: str) -> bool:
        return self.fs.exists(posixpath.join(self.path, name, SAVED_MODEL))

    def versions(self) -> list[int]:
        """Servable versions, oldest first: integer folders holding saved_model.pb."""
        return sorted(int(n) for n in self._entries() if n.isdigit() and self._complete(n))

    def newest(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def rolled_back(self) -> list[int]:
        return sorted(int(n[len(ROLLED_BACK_PREFIX):]) for n in self._entries()
                      if n.startswith(ROLLED_BACK_PREFIX) and n[len(ROLLED_BACK_PREFIX):].isdigit())

    def retired(self) -> list[int]:
        folder = posixpath.join(self.path, RETIRED)
        if not self.fs.isdir(folder):
            return []
        names = (posixpath.basename(p) for p in self.fs.ls(folder, detail=False))
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def every_number_used(self) -> list[int]:
        """Served, rolled back, retired and partial versions: a new version must exceed them all."""
        partial = [int(n) for n in self._entries() if n.isdigit()]
        temp = [int(m.group(1)) for m in (re.match(rf"^{re.escape(TEMP_PREFIX)}(\d+)(?:-|$)", n) for n in self._entries()) if m]
        return sorted(set(self.versions() + self.rolled_back() + self.retired() + partial + temp))

    def next_version(self) -> int:
        """Seconds since the epoch (readable, sortable), or one more than any number already used."""
        used = self.every_number_used()
        return max(int(time.time()), (used[-1] + 1) if used else 0)

    def version_uri(self, version: int) -> str:
        return join(self.uri, str(version))

    def lineage_uri(self, version: int) -> str:
        """Where the lineage of `version` lives now: in the version, aside after rollback, or retired."""
        for folder in (str(version), f"{ROLLED_BACK_PREFIX}{version}"):
            uri = join(self.uri, folder, ASSETS_EXTRA, LINEAGE_FILE)
            if self.fs.exists(filesystem(uri)[1]):
                return uri
        return join(self.uri, RETIRED, f"{version}.json")

    def lineage(self, version: int) -> Lineage | None:
        """The lineage of `version`; None for a version Stoke did not push (nothing records its
        origin, and retirement only its number)."""
        uri = self.lineage_uri(version)
        if not self.fs.exists(filesystem(uri)[1]):
            return None
        record = read_json(uri)
        return Lineage.check(record, uri) if "run_id" in record else None

    # ------------------------------------------------------------------ changing

    def remove_partial(self) -> list[str]:
        """Deletes leftovers of interrupted pushes: temp folders and integer folders without saved_model.pb."""
        # Under the lock no other push is running, so every temp folder left is a dead push's.
        self._locked("removing partial versions")
        removed = []
        for name in self._entries():
            if name.startswith(TEMP_PREFIX) or (name.isdigit() and not self._complete(name)):
                self.fs.rm(posixpath.join(self.path, name), recursive=True)
                removed.append(name)
        return removed

    def publish(self, source: str, version: int, extra: dict[str, bytes]) -> str:
        """Copies the SavedModel folder `source` (same file system as ROOT) plus `extra` files
        (relative path -> bytes) into version `version`, appearing to TF Serving all at once.
        Refuses, and leaves the repository as it was, when the number is taken, even by a push running now."""
        final = posixpath.join(self.path, str(version))
        taken = RepositoryError(f"version {version} already exists in {self.uri}, or another push is writing it")
        if self.fs.exists(final):
            raise taken
        src_fs, src_path = filesystem(source)
        files = sorted(src_fs.find(src_path))
        if not any(f.endswith("/" + SAVED_MODEL) for f in files):
            raise RepositoryError(f"{source} holds no {SAVED_MODEL}")
        relative = [posixpath.relpath(f, src_path) for f in files]
        # saved_model.pb last: on an object store, it is what makes the version loadable.
        relative.sort(key=lambda rel: rel == SAVED_MODEL)
        local = is_local(self.fs)
        target = posixpath.join(self.path, f"{TEMP_PREFIX}{version}") if local else final
        items = list(extra.items())
        try:  # the reservation: an operation that fails when another push has the number
            if local:
                os.makedirs(self.path, exist_ok=True)
                os.mkdir(target)
            elif items:
                self._write(posixpath.join(target, items[0][0]), items[0][1], create=True)
                items = items[1:]
        except FileExistsError:
            raise taken from None
        kill_after = int(os.environ.get(KILL_AFTER_FILES_ENV, "0") or 0)
        try:
            for name, data in items:
                self._write(posixpath.join(target, name), data)
            for count, rel in enumerate(relative, start=1):
                if rel == SAVED_MODEL and self._held is not None:
                    self._held.check()  # a lease lost mid-copy must not publish
                dest = posixpath.join(target, rel)
                self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
                if src_fs is self.fs or type(src_fs) is type(self.fs):
                    self.fs.copy(posixpath.join(src_path, rel), dest)
                else:
                    self.fs.pipe_file(dest, src_fs.cat_file(posixpath.join(src_path, rel)))
                if kill_after and count >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            if local:
                try:
                    os.rename(target, final)  # onto an existing version it fails; it never nests
                except OSError:
                    raise taken from None
        except LeaseLost as lost:
            self.fs.rm(target, recursive=True)
            raise RepositoryError(f"{lost}: stopping before anything becomes visible to TF Serving") from None
        except BaseException:
            self._discard(target)
            raise
        return join(self.uri, str(version))

    def _discard(self, target: str) -> None:
        """Removes a failed push's copy, best effort: when that fails too (a disk gone bad), the error
        that stopped the push is the one reported, and the next push's remove_partial() removes it."""
        try:
            if self.fs.exists(target):
                self.fs.rm(target, recursive=True)
        except OSError:
            pass

    def _write(self, path: str, data: bytes, create: bool = False) -> None:
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, data, mode="create" if create else "overwrite")

    def set_aside(self, version: int) -> str:
        """Takes `version` out of serving without deleting it: renamed to rolled-back-<version>."""
        self._locked("rollback")
        source = posixpath.join(self.path, str(version))
        aside = posixpath.join(self.path, f"{ROLLED_BACK_PREFIX}{version}")
        if self.fs.exists(aside):
            raise RepositoryError(f"{aside} already exists")
        if is_local(self.fs):
            self.fs.mv(source, aside, recursive=True)
        else:
            # Copy aside first, then remove saved_model.pb (the server stops seeing a version), then the rest.
            for path in sorted(self.fs.find(source)):
                self.fs.copy(path, posixpath.join(aside, posixpath.relpath(path, source)))
            self.fs.rm(posixpath.join(source, SAVED_MODEL))
            self.fs.rm(source, recursive=True)
        return join(self.uri, f"{ROLLED_BACK_PREFIX}{version}")

    def retire(self, version: int, when: str) -> None:
        """Deletes an old version, keeping its lineage in _retired/<version>.json."""
        self._locked("retention")
        lineage = self.lineage(version)
        retired = join(self.uri, RETIRED, f"{version}.json")
        if lineage is None:
            write_json(retired, {"version": version, "retired_at": when})
        else:
            lineage.model_copy(update={"retired_at": when}).write(retired)
        source = posixpath.join(self.path, str(version))
        # saved_model.pb first: without it the folder stops looking servable at once, not at the last file.
        self.fs.rm(posixpath.join(source, SAVED_MODEL))
        self.fs.rm(source, recursive=True)

    def apply_retention(self, keep: int, when: str) -> list[int]:
        """Retires all but the newest `keep` versions (the newest is always kept)."""
        self._locked("retention")
        versions = self.versions()
        old = versions[:-max(keep, 1)]
        for version in old:
            self.retire(version, when)
        return old
