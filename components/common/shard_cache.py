"""A local cache of span shards, for a ROOT on a store TensorFlow cannot read (components/common/tf_files.py).

Training and the gate copy the shards they read into CACHE/<ROOT's spans>/span-NNNNN/<file> before
TensorFlow starts, many at a time through fsspec. The span's manifest is the authority: a copy is used
only when its size and SHA-256 are the manifest's, hashed whole each time a run uses it. The marker
beside it (<file>.verified) records the size and digest it was fetched for and, by its time, when it
was last used: a quick way to pass over a copy that cannot match and the order of eviction, never a
reason to trust a copy. Spans are immutable once published, so a span and a file name is a key that
never goes stale. Under the size cap, the copies used longest ago are evicted first, never one that
a running process reads; a run that needs more than the cap, or more than the disk has free, stops
before training with one line. The folder's rules, the pins and partial copies: cache_folder.py.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import math
import os
import posixpath
import re
import shutil
import stat
import sys
import time

from components.common.cache_folder import (
    CACHE_DIR_ENV,
    RUNS,
    CacheError,
    default_folder,
    live_pins,
    locked,
    pin,
    secure,
    sweep_partials,
)
from components.common.files import filesystem
from components.common.local_copies import Folder, UnsafeKey, relative_parts
from components.common.program import printable, setting_hint
from components.common.shard_digests import Mismatch, mismatch
from components.contracts.layout import Shard

MARKER = ".verified"
FETCHERS = 16  # copies in flight: object stores answer each request slowly, not each byte


@dataclasses.dataclass(frozen=True)
class Staged:
    """What staging did: the local copies (in the order asked) and what it took to make them."""
    shards: list[Shard]
    folder: str
    fetched: int
    reused: int
    refetched: list[str]  # cached copies that failed their check and were copied again
    mismatched: list[Mismatch]  # shards whose copy still fails its check: the bucket holds them so
    bytes_fetched: int
    seconds: float

    @property
    def corrupt(self) -> list[str]:
        return [m.shard.uri for m in self.mismatched]

    def to_json(self) -> dict:
        return {"folder": self.folder, "shards": len(self.shards), "fetched": self.fetched, "reused": self.reused,
                "refetched": self.refetched, "corrupt": self.corrupt, "mb_fetched": round(self.bytes_fetched / 1e6, 3),
                "seconds": round(self.seconds, 3),
                "mb_per_sec": round(self.bytes_fetched / 1e6 / self.seconds, 1) if self.fetched and self.seconds else None}


class ShardCache:
    def __init__(self, folder: str | None, max_gb: float):
        self.folder = os.path.abspath(folder or default_folder())
        self.max_bytes = int(max_gb * 1e9)
        self.pin = None

    def key(self, shard: Shard) -> list[str]:
        """The copy's place below the folder: the ROOT's spans folder (named and hashed), the span and the file."""
        span_folder, name = posixpath.split(shard.uri)
        spans, span = posixpath.split(span_folder)
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spans)[-60:].strip("_")
        return relative_parts(f"{slug}-{hashlib.sha256(spans.encode()).hexdigest()[:10]}/{span}/{name}", shard.uri)

    def path(self, shard: Shard) -> str:
        return os.path.join(self.folder, *self.key(shard))

    def local(self, shards: list[Shard]) -> list[Shard]:
        return [dataclasses.replace(s, uri=self.path(s)) for s in shards]

    def needs(self, shards: list[Shard]) -> int:
        """Bytes still to copy for `shards` (by the markers alone: no copy is read)."""
        return sum(s.bytes or 0 for s in shards if _marker(self.folder, self.key(s)) != _expected(s))

    def run_folder(self, name: str) -> str:
        """CACHE/runs/<name>, where training writes before it uploads, reached without following a link."""
        secure(self.folder)
        with Folder.open(self.folder, [RUNS, name], create=True) as folder:
            return folder.path

    def stage(self, shards: list[Shard]) -> Staged:
        """Copies what is not cached yet (or no longer matches its manifest), evicting the least recently used."""
        started = time.monotonic()
        keys = self._keys(shards)
        secure(self.folder)
        with locked(self.folder) as pins:  # pinned before any is checked: an eviction from now on leaves them
            self.pin = pin(self.folder, keys)
            sweep_partials(self.folder, set(live_pins(pins)))
        checked = dict(zip((s.uri for s in shards), _map(self._check, shards)))
        missing = [s for s in shards if checked[s.uri] != "ok"]
        need = sum(s.bytes for s in missing)
        self._make_room(need, sum(s.bytes for s in shards))
        free = shutil.disk_usage(self.folder).free
        if need > free:
            raise CacheError(f"the shard cache {self.folder} has {free / 1e6:,.1f} MB free and this run must copy "
                             f"{need / 1e6:,.1f} MB of shards into it: free space there, or move the cache to a "
                             f"larger disk, {setting_hint(None, {'shard_cache.dir': 'PATH'})} or ${CACHE_DIR_ENV}")
        mismatched = [m for m in _map(self._fetch, missing) if m is not None]
        return Staged(self.local(shards), self.folder, len(missing), len(shards) - len(missing),
                      [uri for uri, state in checked.items() if state == "corrupt"], mismatched, need,
                      time.monotonic() - started)

    def _keys(self, shards: list[Shard]) -> list[str]:
        unchecked = [s.uri for s in shards if s.bytes is None or not s.sha256]
        if unchecked:
            raise CacheError(f"{unchecked[0]} has no size and SHA-256 in its manifest, so no copy of it can be checked")
        try:
            return ["/".join(self.key(s)) for s in shards]
        except UnsafeKey as error:
            raise CacheError(str(error)) from None

    def _check(self, shard: Shard) -> str:
        """"ok" (and marked as just used), "absent", or "corrupt" (and removed)."""
        *folders, name = self.key(shard)
        folder = Folder.open(self.folder, folders, create=False)
        if folder is None:
            return "absent"
        with folder:
            marker, st = _read_marker(folder, name), folder.lstat(name)
            if not marker or st is None:
                return "absent"  # a copy without a marker is never trusted: it is fetched over
            if (marker == _expected(shard) and stat.S_ISREG(st.st_mode) and st.st_size == shard.bytes
                    and _digest(folder, name) == shard.sha256):
                folder.touch(name + MARKER)
                return "ok"
            print(printable(f"stoke: the cached copy of {shard.uri} does not match its manifest; copying it again"),
                  file=sys.stderr, flush=True)
            folder.remove(name + MARKER)  # the marker first: a copy without one is never trusted
            folder.remove(name)
        return "corrupt"

    def _fetch(self, shard: Shard) -> Mismatch | None:
        """Copies one shard and checks it, twice at most; what is wrong when the bucket's copy does not match its
        manifest (then it is left unmarked, for --skip-corrupt to read around a damaged one and the next run to
        fetch again)."""
        fs, remote = filesystem(shard.uri)
        *folders, name = self.key(shard)
        part = f"{name}.part-{self.pin.id}"  # fetched in there; removed if the copy fails (a full disk)
        try:
            with Folder.open(self.folder, folders, create=True) as folder:
                folder.remove(name + MARKER)
                for attempt in range(2):
                    problem = folder.fetch(fs, remote, name, part, lambda box, data: _verify(box, data, shard),
                                           keep_failed=attempt == 1)
                    if problem is None:
                        folder.write_bytes(name + MARKER, json.dumps(_expected(shard)).encode(),
                                           tmp=f"{name}{MARKER}.part-{self.pin.id}")
                        return None
        except OSError as error:
            raise CacheError(f"copying {shard.uri} into the shard cache {self.folder} failed: "
                             f"{error.strerror or error}") from None
        print(printable(f"stoke: {problem}, in the bucket as well as in its copy"), file=sys.stderr, flush=True)
        return problem

    def _make_room(self, need: int, wanted: int) -> None:
        """Evicts the least recently used copies no live pin lists until `need` more bytes fit under the cap."""
        if wanted > self.max_bytes:
            raise CacheError(f"the shards to read take {wanted / 1e9:,.2f} GB, more than the shard cache may hold "
                             f"(shard_cache.max_gb {self.max_bytes / 1e9:g}); raise it, e.g. "
                             f"{setting_hint(None, {'shard_cache.max_gb': math.ceil(wanted / 1e9)})}")
        with locked(self.folder) as pins:
            listed = live_pins(pins).values()
            pinned = set().union(*(p for p in listed if p is not None))
            entries = _copies(self.folder)
            total = sum(size for _, _, size in entries)
            evictable = [] if None in listed else sorted(e for e in entries if e[1] not in pinned)
            for _, rel, size in evictable:
                if total + need <= self.max_bytes:
                    break
                for path in (rel + MARKER, rel):  # the marker first: a copy without one is never trusted
                    _unlink(os.path.join(self.folder, path))
                total -= size
        if total + need > self.max_bytes:
            raise CacheError(f"the shard cache {self.folder} is full of copies that running processes read "
                             f"({total / 1e9:,.2f} GB) and this run must copy {need / 1e9:,.2f} GB more under "
                             f"--shard-cache-max-gb {self.max_bytes / 1e9:g}: raise it, or run when they are done")


def shards_of_worker(shards: list[Shard], workers: int, pipeline: int, by_file: bool) -> list[Shard]:
    """The shards one worker's input pipeline reads: every `workers`-th file from its own when the
    pipelines share out the files (components/train/data.py), else all of them."""
    return shards[pipeline::workers] if by_file and workers > 1 else list(shards)


def _verify(folder: Folder, name: str, shard: Shard) -> Mismatch | None:
    """None when the copy has the manifest's size and SHA-256; else what is wrong, its records read to say it."""
    size = folder.lstat(name).st_size
    if size == shard.bytes and _digest(folder, name) == shard.sha256:
        return None
    return mismatch(shard, size, lambda: folder.reader(name))


def _expected(shard: Shard) -> dict:
    return {"bytes": shard.bytes, "sha256": shard.sha256}


def _digest(folder: Folder, name: str) -> str | None:
    try:
        return folder.sha256(name)
    except OSError:  # gone, or a link put in its place
        return None


def _read_marker(folder: Folder, name: str) -> dict:
    try:
        with folder.reader(name + MARKER) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def _marker(folder: str, key: list[str]) -> dict:
    found = Folder.open(folder, key[:-1], create=False) if os.path.isdir(folder) else None
    if found is None:
        return {}
    with found:
        return _read_marker(found, key[-1])


def _copies(folder: str) -> list[tuple[float, str, int]]:
    """(last used, path relative to the folder, bytes) of every marked copy."""
    found = []
    for parent, folders, files in os.walk(folder):
        if parent == folder:
            folders[:] = [f for f in folders if not f.startswith(".") and f != RUNS]
        for name in files:
            if name.endswith(MARKER):
                copy = os.path.join(parent, name[:-len(MARKER)])
                try:
                    used, size = os.lstat(copy + MARKER).st_mtime, os.lstat(copy).st_size
                except FileNotFoundError:
                    continue
                found.append((used, os.path.relpath(copy, folder), size))
    return found


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _map(function, items: list) -> list:
    if not items:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(FETCHERS, len(items))) as pool:
        return list(pool.map(function, items))
