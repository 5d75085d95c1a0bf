"""ROOT/models/<name>/: the TensorFlow Serving model repository, and the only code that changes it.

TF Serving loads every folder whose name reads as an integer, possibly while a copy is still
running, so a version appears in one step: on file systems it is written under a non-integer temp
name and renamed; object stores have no rename, so `saved_model.pb` (what the server needs to load
anything) is copied last, while a marker `.push-<version>` says whose the folder is until then.
A version number is reserved by an operation that fails when it is taken (creating the temp
folder or the marker; on object stores also the lineage file, only if absent), so two pushes never
share a number or nest one model inside another, and numbers stay within TF Serving's int64.
What the folder holds is read in components/common/model_folders.py. Before each change `tidy()`
deletes only what Stoke's own interrupted pushes left, and sets aside (renames to
`set-aside-<name>`, out of TF Serving's sight) anything else TF Serving would take for a version
that is no version of Stoke's: nothing it does not recognise is ever deleted.
Versions taken out are never deleted by rollback: they are moved to `rolled-back-<version>`.
Retention deletes old versions (saved_model.pb first) but keeps their lineage in `_retired/<version>.json`,
and the answers a version's gate recorded (`assets.extra/stoke_answers.json.gz`) in
`_retired/<version>.answers.json.gz` while a kept version names it as its reference.
Whatever changes the repository runs inside `lock()`: the lease ingest also uses
(components/common/lease.py), an flock on a local disk and a self-renewing lease object on a bucket.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import os
import posixpath
import re
import signal
import time

from components.common.files import filesystem, is_local, join, read_json, write_json
from components.common.lease import TTL, LeaseError, LeaseHeld, LeaseLost, exclusive
from components.common.model_folders import (
    MAX_VERSION,
    SAVED_MODEL,
    SERVING_FILES,
    TEMP_PREFIX,
    Survey,
    survey,
    version_number,
)
from components.contracts.config import MODEL_NAME_PATTERN
from components.contracts.layout import Root
from components.contracts.lineage import Lineage
from components.contracts.summaries import SetAside

log = logging.getLogger(__name__)

ASSETS_EXTRA = "assets.extra"
LINEAGE_FILE = "stoke_lineage.json"
ANSWERS_FILE = "stoke_answers.json.gz"  # the answers recorded at the version's gate (components/gate/answers.py)
RETIRED_ANSWERS = ".answers.json.gz"  # _retired/<version> + this
MODEL_CARD, MODEL_CARD_JSON = "model_card.md", "model_card.json"  # components/push/model_card.py
ROLLED_BACK_PREFIX = "rolled-back-"
SET_ASIDE_PREFIX = "set-aside-"
RETIRED = "_retired"
LOCK_FILE = ".lock"
WAIT_ENV = "STOKE_LOCK_WAIT_SECONDS"  # how long lock() waits for another holder (default 300)
# Fault drill: with this set to N, the push process kills itself (SIGKILL) after copying N files,
# the way a preempted machine stops mid-copy.
KILL_AFTER_FILES_ENV = "STOKE_KILL_AFTER_FILES"
# The kill drill of a push's later steps: SIGKILL right after the named step (tests only).
KILL_AFTER_STEP_ENV = "STOKE_KILL_AFTER_STEP"
KILL_STEPS = ("published", "recorded", "retired")
LINEAGE_READERS = 16  # lineages read at once (spans_named)


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

    def survey(self) -> Survey:
        """Versions, partial pushes and strangers (components/common/model_folders.py)."""
        return survey(self.fs, self.path)

    def versions(self) -> list[int]:
        """Servable versions, oldest first: the versions TF Serving loads, named the way Stoke names them."""
        return self.survey().versions

    def newest(self) -> int | None:
        """The version TF Serving's default policy serves once strangers are set aside: the highest."""
        versions = self.versions()
        return versions[-1] if versions else None

    def rolled_back(self) -> list[int]:
        return sorted(v for v in (version_number(n[len(ROLLED_BACK_PREFIX):]) for n in self._entries()
                                  if n.startswith(ROLLED_BACK_PREFIX)) if v is not None)

    def retired(self) -> list[int]:
        folder = posixpath.join(self.path, RETIRED)
        if not self.fs.isdir(folder):
            return []
        names = (posixpath.basename(p) for p in self.fs.ls(folder, detail=False))
        return sorted(v for v in (version_number(n[:-5]) for n in names if n.endswith(".json")) if v is not None)

    def every_number_used(self) -> list[int]:
        """Served, rolled back, retired and interrupted versions: a new version must exceed them all."""
        found = self.survey()
        return sorted(set(found.versions + found.in_flight + self.rolled_back() + self.retired()))

    def next_version(self) -> int:
        """Seconds since the epoch (readable, sortable), or one more than any number already used,
        within TF Serving's int64: past it, models.config would not parse and the server not start."""
        used = self.every_number_used()
        version = max(int(time.time()), (used[-1] + 1) if used else 0)
        if version > MAX_VERSION:
            raise RepositoryError(f"{self.uri} has no version number left: {used[-1]} is taken and TF Serving reads "
                                  f"versions as int64 (at most {MAX_VERSION}); move what holds {used[-1]} (the version, "
                                  f"{ROLLED_BACK_PREFIX}{used[-1]} or {RETIRED}/{used[-1]}.json) out of the repository")
        return version

    def version_uri(self, version: int) -> str:
        return join(self.uri, str(version))

    def lineage_uri(self, version: int) -> str:
        """Where the lineage of `version` lives now: in its folder while one holds the number, else aside after
        rollback, else retired. A lineage belongs to its folder: a model put at a number rolled back or retired
        does not inherit that version's lineage (it has its own, or none)."""
        if self.fs.exists(posixpath.join(self.path, str(version))):
            return join(self.uri, str(version), ASSETS_EXTRA, LINEAGE_FILE)
        aside = self._aside_lineage_uri(version)
        return aside if self.fs.exists(filesystem(aside)[1]) else join(self.uri, RETIRED, f"{version}.json")

    def _aside_lineage_uri(self, version: int) -> str:
        return join(self.uri, f"{ROLLED_BACK_PREFIX}{version}", ASSETS_EXTRA, LINEAGE_FILE)

    def answers_uri(self, version: int) -> str:
        """Where the answers recorded at the gate of `version` live while it may be a reference: in its folder
        while one holds the number (as its lineage), else retired; never in a rolled-back version, which is no
        reference."""
        if self.fs.exists(posixpath.join(self.path, str(version))):
            return join(self.uri, str(version), ASSETS_EXTRA, ANSWERS_FILE)
        return join(self.uri, RETIRED, f"{version}{RETIRED_ANSWERS}")

    def lineage(self, version: int, rolled_back: bool = False) -> Lineage | None:
        """The lineage of `version` (lineage_uri), or with `rolled_back` the one rolled-back-<version> keeps;
        None for a version Stoke did not push (nothing records its origin, and retirement only its number)."""
        uri = self._aside_lineage_uri(version) if rolled_back else self.lineage_uri(version)
        if not self.fs.exists(filesystem(uri)[1]):
            return None
        record = read_json(uri)
        # A record of a rollback of a version Stoke did not push has no run; anything but an object is no lineage.
        return Lineage.check(record, uri) if not isinstance(record, dict) or "run_id" in record else None

    # ------------------------------------------------------------------ changing

    def tidy(self) -> Tidied:
        """Deletes what Stoke's interrupted pushes left, and sets every stranger aside, so that what TF
        Serving would take for a version is exactly versions(). Nothing else is deleted."""
        # Under the lock no other push is running, so every partial left is a dead push's.
        self._locked("tidying the repository")
        found = self.survey()
        for name in found.partial:
            self.fs.rm(posixpath.join(self.path, name), recursive=True)
        taken = set(self._entries())
        aside = []
        for name, why in found.strangers.items():
            new = next(n for n in (f"{SET_ASIDE_PREFIX}{name}" + (f"-{i}" if i > 1 else "")
                                   for i in itertools.count(1)) if n not in taken)
            self._move(name, new)
            taken.add(new)
            aside.append(SetAside(name=name, moved_to=join(self.uri, new), reason=why))
            log.warning("set aside %s as %s: %s", join(self.uri, name), new, why)
        return Tidied(found.partial, aside)

    def publish(self, source: str, version: int, extra: dict[str, bytes]) -> str:
        """Copies the SavedModel folder `source` (same file system as ROOT) plus `extra` files
        (relative path -> bytes) into version `version`, appearing to TF Serving all at once.
        Refuses, and leaves the repository as it was, when the number is taken, even by a push running now."""
        final = posixpath.join(self.path, str(version))
        temp = posixpath.join(self.path, f"{TEMP_PREFIX}{version}")
        taken = RepositoryError(f"version {version} already exists in {self.uri}, or another push is writing it")
        if version_number(str(version)) is None:
            raise RepositoryError(f"{version} is no version number TF Serving reads (0 to {MAX_VERSION})")
        if self.fs.exists(final):
            raise taken
        src_fs, src_path = filesystem(source)
        relative = sorted(posixpath.relpath(f, src_path) for f in src_fs.find(src_path))
        if not set(relative) & set(SERVING_FILES):
            raise RepositoryError(f"{source} holds no {SAVED_MODEL}")
        # saved_model.pb last: on an object store, it is what makes the version loadable.
        relative.sort(key=lambda rel: rel in SERVING_FILES)
        local = is_local(self.fs)
        target = temp if local else final
        try:
            items = self._reserve(temp, final, list(extra.items()))
        except FileExistsError:
            raise taken from None
        kill_after = int(os.environ.get(KILL_AFTER_FILES_ENV, "0") or 0)
        try:
            for name, data in items:
                self._write(posixpath.join(target, name), data)
            for count, rel in enumerate(relative, start=1):
                if rel in SERVING_FILES and self._held is not None:
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
                    os.rename(temp, final)  # onto an existing version it fails; it never nests
                except OSError:
                    raise taken from None
        except LeaseLost as lost:
            self.fs.rm(target, recursive=True)
            self._discard(temp)
            raise RepositoryError(f"{lost}: stopping before anything becomes visible to TF Serving") from None
        except BaseException:
            self._discard(target)
            self._discard(temp)
            raise
        if not local:
            self._discard(temp)  # the version is complete; a marker left behind is removed by tidy()
        return join(self.uri, str(version))

    def _reserve(self, temp: str, final: str, items: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """Takes the version's number with operations that fail (FileExistsError) when another push has
        it: the temp folder on a disk; on an object store the marker, then the first extra file in the
        version folder itself. Returns the extra files still to write."""
        if is_local(self.fs):
            os.makedirs(self.path, exist_ok=True)
            os.mkdir(temp)
            return items
        self._write(temp, b"", create=True)  # the marker: until saved_model.pb is in, the folder is this push's
        if not items:
            return items
        try:
            self._write(posixpath.join(final, items[0][0]), items[0][1], create=True)
        except FileExistsError:
            self.fs.rm(temp)
            raise
        return items[1:]

    def _discard(self, target: str) -> None:
        """Removes a failed push's copy, best effort: when that fails too (a disk gone bad), the error
        that stopped the push is the one reported, and the next push's tidy() removes it."""
        try:
            if self.fs.exists(target):
                self.fs.rm(target, recursive=True)
        except OSError:
            pass

    def _write(self, path: str, data: bytes, create: bool = False) -> None:
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, data, mode="create" if create else "overwrite")

    def _move(self, name: str, new: str) -> None:
        """Renames the child `name` to `new`: one rename on a disk (a link moves, its target stays as
        it is); on an object store a copy, then the files that make it loadable go first."""
        source, target = posixpath.join(self.path, name), posixpath.join(self.path, new)
        if is_local(self.fs):
            os.rename(source, target)
            return
        if not self.fs.isdir(source):
            self.fs.copy(source, target)
            self.fs.rm(source)
            return
        for path in sorted(self.fs.find(source)):
            self.fs.copy(path, posixpath.join(target, posixpath.relpath(path, source)))
        self._unload(source)
        self.fs.rm(source, recursive=True)

    def _unload(self, folder: str) -> None:
        """Removes the files TF Serving loads a folder by: it stops looking servable at once, not at the last file."""
        for name in SERVING_FILES:
            if self.fs.exists(posixpath.join(folder, name)):
                self.fs.rm(posixpath.join(folder, name))

    def take_out(self, version: int) -> str:
        """Takes `version` out of serving without deleting it: renamed to rolled-back-<version>."""
        self._locked("rollback")
        aside = f"{ROLLED_BACK_PREFIX}{version}"
        if self.fs.exists(posixpath.join(self.path, aside)):
            raise RepositoryError(f"{join(self.uri, aside)} already exists")
        self._move(str(version), aside)
        return join(self.uri, aside)

    def retire(self, version: int, when: str, held: bool = False) -> None:
        """Deletes an old version, keeping its lineage in _retired/<version>.json and, when a kept version is
        `held` to it, its recorded answers beside it."""
        self._locked("retention")
        lineage = self.lineage(version)
        retired = join(self.uri, RETIRED, f"{version}.json")
        if lineage is None:
            write_json(retired, {"version": version, "retired_at": when})
        else:
            write_json(retired, lineage.model_copy(update={"retired_at": when}).to_json())
        source = posixpath.join(self.path, str(version))
        answers = posixpath.join(source, ASSETS_EXTRA, ANSWERS_FILE)
        if held and self.fs.exists(answers):
            self.fs.copy(answers, posixpath.join(self.path, RETIRED, f"{version}{RETIRED_ANSWERS}"))
        self._unload(source)
        self.fs.rm(source, recursive=True)

    def apply_retention(self, keep: int, when: str) -> list[int]:
        """Retires all but the newest `keep` versions (the newest is always kept), and keeps the recorded
        answers of exactly the references the kept versions name. Only versions(): a stranger is set aside
        by tidy(), never retired."""
        self._locked("retention")
        versions = self.versions()
        old, kept = versions[:-max(keep, 1)], versions[-max(keep, 1):]
        held = {lineage.reference for lineage in map(self.lineage, kept) if lineage is not None}
        for version in old:
            self.retire(version, when, held=version in held)
        folder = posixpath.join(self.path, RETIRED)
        names = [posixpath.basename(p) for p in self.fs.ls(folder, detail=False)] if self.fs.isdir(folder) else []
        for name in names:  # the answers of references no kept version names any longer (Stoke's names only)
            number = version_number(name[:-len(RETIRED_ANSWERS)]) if name.endswith(RETIRED_ANSWERS) else None
            if number is not None and number not in held:
                self.fs.rm(posixpath.join(folder, name))
        return old


def model_names(root: Root) -> list[str]:
    """The model repositories under ROOT/models: its folders named as a model may be."""
    fs, path = filesystem(join(root.uri, "models"))
    if not fs.isdir(path):
        return []
    names = (posixpath.basename(e["name"].rstrip("/")) for e in fs.ls(path, detail=True) if e["type"] == "directory")
    return sorted(name for name in names if re.fullmatch(MODEL_NAME_PATTERN, name))


def spans_named(root: Root) -> set[int]:
    """Every span number a lineage under ROOT/models names: of each model's served, rolled-back, retired and
    interrupted versions, read many at a time (retired lineages add up, and a bucket answers each slowly).
    Raises RepositoryError for a lineage that cannot be read: it could name any span."""
    def spans(repository: Repository, version: int) -> list[int]:
        try:
            lineage = repository.lineage(version)
        except (OSError, ValueError) as error:
            raise RepositoryError(f"the lineage of version {version} of model {repository.name} "
                                  f"({repository.lineage_uri(version)}) cannot be read ({error}), so it could name "
                                  "any span; restore it from a backup, or move it out of the repository") from None
        return [span.span for span in lineage.spans] if lineage is not None else []

    versions = [(repository, version) for repository in (Repository(root, name) for name in model_names(root))
                for version in repository.every_number_used()]
    with concurrent.futures.ThreadPoolExecutor(LINEAGE_READERS) as pool:
        return {span for named in pool.map(lambda found: spans(*found), versions) for span in named}


@dataclasses.dataclass(frozen=True)
class Tidied:
    """What tidy() did: the partial pushes it deleted and the strangers it set aside."""
    removed: list[str]
    set_aside: list[SetAside]
