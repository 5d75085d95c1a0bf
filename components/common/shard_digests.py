"""Shards checked against their manifest before TensorFlow reads them where they are (a local ROOT, gs://).

The manifest names each shard's size and SHA-256, as ingest wrote it. A shard read in place is checked
against them before training or the gate reads it: its size every time (a stat), its SHA-256 once for
the file as it is, recorded in the shard cache's folder (CACHE/.digests/, one small file per span folder)
under the file's identity: on a local disk its device, inode, size, mtime and ctime; in a store its size
and version (the ETag or generation, which the store changes with every write). Any write to a file
changes its ctime, which no program sets back (utime sets mtime only), and a file put in its place is
another inode, so a recorded digest stands only for the very file it was computed on. What the key
cannot see: a change made with the system clock turned back, or by writing the disk beneath the file
system. A file whose ctime is within RACY_SECONDS of its hashing is not recorded (it is hashed again
next time): a file system with coarse timestamps could otherwise hide a write made in the same tick,
as git says of its racy index entries. Records are bounded: a span folder's file goes once unused for
KEEP_DAYS, and a folder the cache refuses (another user's, writable by others) is not read or written:
every shard is then hashed, every time.

A shard that does not match is read (every record's CRC checked) to say why: damaged (a record fails its
CRC, or the file ends inside one: --skip-corrupt may read around it), or changed (its records read, but
they are not the ones published: never read). Copies from other stores are checked whole, every time, by
the shard cache (shard_cache.py), with the same words.
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
import threading
import time
import zlib

from components.common.cache_folder import CacheError, default_folder, locked, secure
from components.common.files import filesystem, is_local
from components.common.local_copies import Folder
from components.common.program import setting_hint
from components.common.tfrecord import BadRecord, count_records
from components.contracts.layout import Shard

DIGESTS = ".digests"  # in the shard cache's folder
RACY_SECONDS = 2  # coarser than any file system's timestamps: FAT's mtime, whole seconds elsewhere
KEEP_DAYS = 90
HASHERS = 4  # files hashed at once: hashlib lets go of the GIL, so each takes a core
FETCHERS = 16  # a store's files looked at once (Watched): each request waits on the store, not a core


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A shard that is not the file its manifest names, and why."""
    shard: Shard
    why: str  # "has 10 bytes where its manifest says 12", "is corrupt (...)", "is missing", ...
    damaged: bool  # a record fails its CRC or is cut short: --skip-corrupt may read around it

    def __str__(self) -> str:
        return f"{self.shard.uri} {self.why}"


@dataclasses.dataclass(frozen=True)
class Checked:
    """What checking the shards found, and what it cost."""
    mismatched: list[Mismatch]
    shards: int
    hashed: int  # shards whose SHA-256 was computed (the others were known by their identity)
    bytes_hashed: int
    seconds: float
    unrecorded: str | None = None  # why no digest could be recorded (a cache folder refused): all hashed
    known: int = 0  # shards whose recorded digest stood for them as they are

    def describe(self) -> str:
        return (f"checked {self.shards} shards against their manifests: {self.hashed} hashed "
                f"({self.bytes_hashed / 1e6:,.1f} MB in {self.seconds:,.1f} s), {self.known} known unchanged"
                + (f"; no digest recorded: {self.unrecorded}" if self.unrecorded else ""))


def check(shards: list[Shard], cache_dir: str | None = None, now: float | None = None) -> Checked:
    """Each shard against its manifest's size and SHA-256 (hashed only when its identity is not recorded
    with that digest); `now` stands for the clock in tests."""
    started = time.monotonic()
    book = Book.open(cache_dir)
    outcomes = _map(lambda shard: _check(shard, book, time.time() if now is None else now), shards)
    book.save()
    hashed = [size for _, size in outcomes if size is not None]
    return Checked([m for m, _ in outcomes if m is not None], len(shards), len(hashed), sum(hashed),
                   time.monotonic() - started, book.refused,
                   known=sum(1 for m, size in outcomes if m is None and size is None))


class Watched:
    """The files a run reads, each by its identity as the digests are keyed (a stat on a local disk: device,
    inode, size, mtime, ctime; in a store, its size and version), taken before they are checked. TensorFlow
    opens them again every epoch, so a run asks `changed()` again as it goes: a file written or replaced since
    it was taken is no longer the file its check passed."""

    def __init__(self, shards: list[Shard], read: list[Shard] | None = None):
        """`shards` as published; `read`, the files TensorFlow reads in their place (copies in the shard
        cache), or None when it reads them where they are."""
        self.files = [(shard, *filesystem(file.uri)) for shard, file in zip(shards, read or shards)]
        self.read_in_place = read is None
        self.identities = self._identities()

    def _identities(self) -> list[tuple | None]:
        def identity(fs, path):
            try:
                found, size = _identity(fs, path)
            except FileNotFoundError:
                return None
            return found or ("size", size)  # a store that versions nothing: its size, at least

        if all(is_local(fs) for _, fs, _ in self.files):
            return [identity(fs, path) for _, fs, path in self.files]  # a stat each: microseconds
        with concurrent.futures.ThreadPoolExecutor(FETCHERS) as pool:  # a request each: many in flight
            return list(pool.map(lambda file: identity(*file[1:]), self.files))

    def changed(self) -> list[tuple[Shard, str]]:
        """The shards whose file is not the one it was when taken (missing included), with the path read."""
        return [(shard, path) for (shard, _, path), then, now in zip(self.files, self.identities, self._identities())
                if now is None or now != then]

    def changed_while_read(self, changed: list[tuple[Shard, str]]) -> str:
        """One line for files that changed under a run, and what to do."""
        spans = ", ".join(map(str, sorted({shard.span for shard, _ in changed})))
        named = ", ".join(shard.uri if self.read_in_place else f"{shard.uri} (its copy {path})"
                          for shard, path in changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        fix = ("restore the span's folder from a backup (or ingest its sources again into a new span), then train again"
               if self.read_in_place else "train again: the shard cache copies a shard again when its copy fails its check")
        return (f"span {spans} changed while training read it: {named} is not the file checked before training (written "
                f"or replaced since); the run stops without a candidate, its backup dropped (it may hold what it learnt "
                f"from the changed file); {fix}")


def changed_spans(changed: list[Mismatch]) -> str:
    """One line for shards whose files are not those published: which, and what to do."""
    spans = ", ".join(map(str, sorted({m.shard.span for m in changed})))
    named = "; ".join(map(str, changed[:3])) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
    return (f"span {spans} changed after it was published: {named}; restore the span's folder from a backup "
            "(or ingest its sources again into a new span)")


def _check(shard: Shard, book: Book, now: float) -> tuple[Mismatch | None, int | None]:
    """The shard's mismatch or None, and the bytes hashed (None: nothing was)."""
    fs, path = filesystem(shard.uri)
    try:
        identity, size = _identity(fs, path)
    except FileNotFoundError:
        return Mismatch(shard, "is missing", damaged=False), None
    if size != shard.bytes:
        return mismatch(shard, size, lambda: fs.open(path, "rb")), None
    if identity is not None and book.known(shard, identity):
        return None, None
    if _sha256(fs, path) != shard.sha256:
        return mismatch(shard, size, lambda: fs.open(path, "rb")), size
    if identity is not None and _identity(fs, path)[0] == identity and not _racy(fs, identity, now):
        book.add(shard, identity)
    return None, size


def _sha256(fs, path: str) -> str:
    if is_local(fs):
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _identity(fs, path: str) -> tuple[tuple | None, int]:
    """What tells this file from any other and from itself before a write, and its size; None when the
    store offers nothing that every write changes (then it is hashed every time)."""
    if is_local(fs):
        st = os.stat(path)
        return ("local", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), st.st_size
    info = fs.info(path)
    version = next((str(info[k]) for k in ("generation", "ETag", "etag") if info.get(k)), None)
    return (("store", int(info["size"]), version) if version else None), int(info["size"])


def _racy(fs, identity: tuple, now: float) -> bool:
    return is_local(fs) and identity[-1] > (now - RACY_SECONDS) * 1e9


def mismatch(shard: Shard, size: int, opener) -> Mismatch:
    """Why a file that is not its manifest's (`size` bytes; `opener()` reads it) differs: its records read to say it."""
    try:
        with opener() as raw:
            if shard.compression == "GZIP":
                with gzip.open(raw) as stream:
                    records = count_records(stream)
            elif shard.compression == "ZLIB":
                records = count_records(io.BytesIO(zlib.decompress(raw.read())))
            else:
                records = count_records(raw)
    except (BadRecord, OSError, EOFError, zlib.error) as error:
        return Mismatch(shard, f"is corrupt ({error})", damaged=True)
    if size != shard.bytes:
        why = f"has {size} bytes where its manifest says {shard.bytes}"
    elif records != shard.records:
        why = f"holds {records} records where its manifest says {shard.records}"
    else:
        why = "is not the file its manifest's SHA-256 names"
    return Mismatch(shard, why, damaged=False)


class Book:
    """The recorded digests, one file per span folder in CACHE/.digests, read when first asked and
    written back (merged with what another process wrote meanwhile) by save()."""

    def __init__(self, folder: str | None, refused: str | None = None):
        self.folder, self.refused = folder, refused
        self.known_entries: dict[str, dict] = {}  # span folder -> file name -> entry
        self.added: dict[str, dict] = {}
        self.lock = threading.Lock()

    @classmethod
    def open(cls, cache_dir: str | None) -> Book:
        folder = os.path.abspath(cache_dir or default_folder())
        try:
            secure(folder)
        except CacheError as error:
            return cls(None, f"{error}; use a folder of your own for the shard cache, "
                             f"{setting_hint(None, {'shard_cache.dir': 'PATH'})}")
        return cls(folder)

    def known(self, shard: Shard, identity: tuple) -> bool:
        folder, name = _where(shard)
        with self.lock:
            if folder not in self.known_entries:
                self.known_entries[folder] = self._read(folder)
            entry = self.known_entries[folder].get(name)
        return entry == {"identity": list(identity), "sha256": shard.sha256}

    def add(self, shard: Shard, identity: tuple) -> None:
        folder, name = _where(shard)
        with self.lock:
            self.added.setdefault(folder, {})[name] = {"identity": list(identity), "sha256": shard.sha256}

    def save(self) -> None:
        if self.folder is None or not self.added:
            return
        with locked(self.folder), Folder.open(self.folder, [DIGESTS], create=True) as digests:
            for span_folder, entries in self.added.items():
                name = _file_name(span_folder)
                shards = {**self._read(span_folder, digests), **entries}
                data = json.dumps({"folder": span_folder, "shards": shards}, sort_keys=True).encode()
                digests.write_bytes(name, data, tmp=f"{name}.tmp-{os.getpid()}")
            _prune(digests)

    def _read(self, span_folder: str, digests: Folder | None = None) -> dict:
        """The recorded entries of one span folder ({} when none, or unreadable); a read marks it used."""
        if self.folder is None:
            return {}
        if digests is None:
            with Folder.open(self.folder, [DIGESTS], create=True) as opened:
                return self._read(span_folder, opened)
        name = _file_name(span_folder)
        try:
            with digests.reader(name) as f:
                data = json.load(f)
            digests.touch(name)
        except (OSError, ValueError):
            return {}
        shards = data.get("shards") if isinstance(data, dict) and data.get("folder") == span_folder else None
        return shards if isinstance(shards, dict) else {}


def _where(shard: Shard) -> tuple[str, str]:
    """The shard's span folder as this machine names it (a local one by its real path) and its file name."""
    fs, path = filesystem(shard.uri)
    folder, name = posixpath.split(shard.uri)
    return (os.path.realpath(os.path.dirname(path)) if is_local(fs) else folder), name


def _file_name(span_folder: str) -> str:
    return hashlib.sha256(span_folder.encode()).hexdigest()[:32] + ".json"


def _prune(digests: Folder) -> None:
    """Removes the records of span folders no check has used for KEEP_DAYS."""
    cutoff = time.time() - KEEP_DAYS * 86400
    for name in digests.names():
        st = digests.lstat(name)
        if st is not None and st.st_mtime < cutoff:
            digests.remove(name)


def _map(function, items: list) -> list:
    if not items:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(HASHERS, len(items))) as pool:
        return list(pool.map(function, items))
