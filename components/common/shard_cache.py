"""A local cache of span shards, for a ROOT on a store TensorFlow cannot read (components/common/tf_files.py).

Training and the gate copy the shards they read into CACHE/<ROOT's spans>/span-NNNNN/<file> before
TensorFlow starts, many at a time through fsspec. A copy counts only once it is verified: its size
against the manifest, every record's CRCs and the record count; a marker beside it then keeps its
size and the CRC32C of the whole file, which later runs check (one fast pass over the bytes)
before reusing it. Spans are immutable once published, so a span and a file name is a key that
never goes stale. Under the size cap, the copies used longest ago are evicted first; a run that
needs more than the cap, or more than the disk has free, stops before training with one line.
Two runs may share a cache folder: a copy lands under a temporary name and is renamed into place.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import gzip
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import sys
import tempfile
import time
import zlib

import google_crc32c

from components.common.files import filesystem
from components.common.tfrecord import BadRecord, count_records
from components.contracts.layout import Shard
from components.contracts.program import printable

CACHE_DIR_ENV = "STOKE_CACHE_DIR"
MARKER = ".verified"
FETCHERS = 16  # copies in flight: object stores answer each request slowly, not each byte
CHUNK = 4 << 20


class CacheError(Exception):
    """A cache that cannot hold what the run needs; the message says what to change."""


def default_folder() -> str:
    """$STOKE_CACHE_DIR (a fast local disk, such as NVMe), else a folder in the temp directory."""
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(tempfile.gettempdir(), "stoke-cache")


@dataclasses.dataclass(frozen=True)
class Staged:
    """What staging did: the local copies (in the order asked) and what it took to make them."""
    shards: list[Shard]
    folder: str
    fetched: int
    reused: int
    refetched: list[str]  # cached copies that failed their check and were copied again
    corrupt: list[str]  # shards whose copy still fails its check: the bucket holds them so
    bytes_fetched: int
    seconds: float

    def to_json(self) -> dict:
        return {"folder": self.folder, "shards": len(self.shards), "fetched": self.fetched, "reused": self.reused,
                "refetched": self.refetched, "corrupt": self.corrupt, "mb_fetched": round(self.bytes_fetched / 1e6, 3),
                "seconds": round(self.seconds, 3),
                "mb_per_sec": round(self.bytes_fetched / 1e6 / self.seconds, 1) if self.fetched and self.seconds else None}


class ShardCache:
    def __init__(self, folder: str | None, max_gb: float):
        self.folder = os.path.abspath(folder or default_folder())
        self.max_bytes = int(max_gb * 1e9)

    def path(self, shard: Shard) -> str:
        """The copy's place: keyed by the ROOT's spans folder, the span and the file."""
        span_folder, name = posixpath.split(shard.uri)
        spans, span = posixpath.split(span_folder)
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spans)[-60:].strip("_")
        return os.path.join(self.folder, f"{slug}-{hashlib.sha256(spans.encode()).hexdigest()[:10]}", span, name)

    def local(self, shards: list[Shard]) -> list[Shard]:
        return [dataclasses.replace(s, uri=self.path(s)) for s in shards]

    def needs(self, shards: list[Shard]) -> int:
        """Bytes still to copy for `shards` (by the markers alone: no file is read)."""
        return sum(_size(s) for s in shards if _marker(self.path(s)).get("bytes") != _size(s))

    def stage(self, shards: list[Shard]) -> Staged:
        """Copies what is not cached yet (or no longer verifies), evicting the least recently used."""
        started = time.monotonic()
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as error:
            raise CacheError(f"cannot create the shard cache {self.folder}: {error.strerror}") from None
        checked = dict(zip((s.uri for s in shards), _map(self._check, shards)))
        missing = [s for s in shards if checked[s.uri] != "ok"]
        need = sum(_size(s) for s in missing)
        self._make_room(need, {self.path(s) for s in shards}, sum(_size(s) for s in shards))
        free = shutil.disk_usage(self.folder).free
        if need > free:
            raise CacheError(f"the shard cache {self.folder} has {free / 1e6:,.1f} MB free and this run must copy "
                             f"{need / 1e6:,.1f} MB of shards into it: free space there, or set --shard-cache-dir "
                             f"(or ${CACHE_DIR_ENV}) to a larger disk")
        corrupt = [s.uri for s, ok in zip(missing, _map(self._fetch, missing)) if not ok]
        return Staged(self.local(shards), self.folder, len(missing), len(shards) - len(missing),
                      [uri for uri, state in checked.items() if state == "corrupt"], corrupt, need,
                      time.monotonic() - started)

    def _check(self, shard: Shard) -> str:
        """"ok" (and marked as just used), "absent", or "corrupt" (and removed)."""
        local = self.path(shard)
        marker = _marker(local)
        if not marker:
            return "absent"
        if (marker.get("bytes") == _size(shard) and os.path.exists(local) and os.path.getsize(local) == marker["bytes"]
                and _crc32c(local) == marker.get("crc32c")):
            os.utime(local + MARKER)
            return "ok"
        print(printable(f"stoke: the cached copy of {shard.uri} fails its check; copying it again"), file=sys.stderr,
              flush=True)
        _remove(local)
        return "corrupt"

    def _fetch(self, shard: Shard) -> bool:
        """Copies one shard and verifies it, twice at most; False when the bucket's copy is corrupt
        (then it is left unmarked, for --skip-corrupt to read around and the next run to fetch again)."""
        fs, remote = filesystem(shard.uri)
        local = self.path(shard)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        part = f"{local}.part-{os.getpid()}"
        for _ in range(2):
            fs.get_file(remote, part)
            problem = _verify(part, shard)
            if problem is None:
                os.replace(part, local)
                _write_marker(local)
                return True
        os.replace(part, local)
        print(printable(f"stoke: {shard.uri} {problem}, in the bucket as well as in its copy"), file=sys.stderr, flush=True)
        return False

    def _make_room(self, need: int, keep: set[str], wanted: int) -> None:
        """Evicts the least recently used copies not in `keep` until `need` more bytes fit under the cap."""
        if wanted > self.max_bytes:
            raise CacheError(f"the shards to read take {wanted / 1e9:,.2f} GB, more than the shard cache may hold "
                             f"(--shard-cache-max-gb {self.max_bytes / 1e9:g}); raise it")
        entries = []
        for marker in _markers(self.folder):
            local = marker[:-len(MARKER)]
            entries.append((os.path.getmtime(marker), local, _marker(local).get("bytes", 0)))
        total = sum(size for _, _, size in entries)
        for _, local, size in sorted(e for e in entries if e[1] not in keep):
            if total + need <= self.max_bytes:
                break
            _remove(local)
            total -= size


def shards_of_worker(shards: list[Shard], workers: int, pipeline: int, by_file: bool) -> list[Shard]:
    """The shards one worker's input pipeline reads: every `workers`-th file from its own when the
    pipelines share out the files (components/train/input_pipeline.py), else all of them."""
    return shards[pipeline::workers] if by_file and workers > 1 else list(shards)


def _verify(path: str, shard: Shard) -> str | None:
    """None when the copy has the manifest's size and records, each passing its CRCs; else what is wrong."""
    size = os.path.getsize(path)
    if shard.bytes is not None and size != shard.bytes:
        return f"has {size} bytes where its manifest says {shard.bytes}"
    try:
        with open(path, "rb") as raw:
            if shard.compression == "GZIP":
                with gzip.open(raw) as stream:
                    records = count_records(stream)
            elif shard.compression == "ZLIB":
                records = count_records(io.BytesIO(zlib.decompress(raw.read())))
            else:
                records = count_records(raw)
    except (BadRecord, OSError, EOFError, zlib.error) as error:
        return f"is corrupt ({error})"
    return None if records == shard.records else f"holds {records} records where its manifest says {shard.records}"


def _size(shard: Shard) -> int:
    if shard.bytes is not None:
        return shard.bytes
    fs, path = filesystem(shard.uri)
    return fs.size(path)


def _crc32c(path: str) -> str:
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            checksum.update(block)
    return checksum.hexdigest().decode()


def _write_marker(local: str) -> None:
    with open(local + MARKER, "w") as f:
        json.dump({"bytes": os.path.getsize(local), "crc32c": _crc32c(local)}, f)


def _marker(local: str) -> dict:
    try:
        with open(local + MARKER) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _markers(folder: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.endswith(MARKER)]


def _remove(local: str) -> None:
    for path in (local + MARKER, local):  # the marker first: a copy without one is never trusted
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _map(function, items: list) -> list:
    if not items:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(FETCHERS, len(items))) as pool:
        return list(pool.map(function, items))
