"""A span's content index as every reader gets it: checked as it streams (content_index.read_index)
and, when it is missing or fails the check, rebuilt from what the span holds, with a warning naming
the file, then read again from the start. Nothing a reader saw of a broken index is kept.

The rebuild reads every record of the span's shards through the checked TFRecord reader and computes
each line as ingest did (components/common/signatures.py): the SHA-256 of the source file's bytes and
the dHash of the picture as ingest decoded it. A record ingest kept as it came (an RGB JPEG or an
8-bit RGB PNG within --max-side: its stored bytes have its source's size) gives both from its stored
bytes. A record ingest re-encoded (CMYK, 16-bit, alpha, resized, ...) does not hold its source's
bytes: its source file is read again when it still has the size and version the manifest records
and normalizes to exactly the stored bytes, and its line is then the one ingest wrote. When that
source is gone or changed, the line is computed from the stored bytes and the warning counts such
lines: an exact copy of that source would then be caught by its dHash, as a near-duplicate, only.

The rebuilt index is stored in the span, whole or not at all (content_index.write_index); where ROOT
cannot be written, in a local temp folder for this run. A span whose shards are themselves corrupt
cannot be indexed again: the reader stops with one line naming the shard.
"""
from __future__ import annotations

import gzip
import io
import os
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import count, repeat
from typing import TypeVar

import fsspec

from components.common.content_index import BrokenIndex, read_index, write_index
from components.common.files import filesystem, is_uri, join, read_result, version_of
from components.common.images import Rejected, normalize
from components.common.program import printable
from components.common.signatures import sha256
from components.common.spans import Spans
from components.common.tfrecord import BadRecord, read_records
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.schema import ENCODED, SOURCE, TEXT, example_bytes
from components.contracts.secrets import SourceCredentials, recorded

T = TypeVar("T")
LOCAL = fsspec.filesystem("file")
THREADS = 8  # records indexed at once: decoding runs in C, re-reading a source waits on the store


class SpanUnreadable(ResultError):
    """A span whose content index cannot be rebuilt, because its shards are corrupt too."""


def verified(root: Root, work: Callable[[Callable[[int], Iterator[str]]], T]) -> T:
    """`work(lines)`, where `lines(number)` streams span `number`'s content index, checked as it is
    read. When an index turns out missing or damaged it is rebuilt and `work` runs again from the start."""
    with tempfile.TemporaryDirectory(prefix="stoke-content-index-") as workdir:
        where: dict[int, str] = {}
        counts: dict[int, int] = {}

        def lines(number: int) -> Iterator[str]:
            if number not in counts:
                counts[number] = _records(root, number)
            return read_index(where.get(number, root.content_index(number)), number, counts[number])

        while True:
            try:
                return work(lines)
            except BrokenIndex as broken:
                if broken.number in where:
                    raise  # rebuilt from the span a moment ago and still unreadable: the store itself fails
                where[broken.number] = rebuild(root, broken.number, workdir, broken.why)


def _records(root: Root, number: int) -> int:
    manifest = next(Spans(root).each_manifest([number], checked=False, sources=False), None)
    if manifest is None:
        raise ResultError(f"span {number} is not published under {root.spans}")
    return sum(entry.records for entry in manifest.shards)


def rebuild(root: Root, number: int, workdir: str, why: str) -> str:
    """Span `number`'s content index computed from its shards and stored; returns where it is."""
    uri = root.content_index(number)
    manifest = read_result(root.manifest(number), SpanManifest)
    sources = {s.uri: (s.size, s.version) for s in manifest.sources}
    kept, stored_only = [], 0
    with ThreadPoolExecutor(THREADS) as pool:
        for entry in manifest.shards:
            shard = join(root.span(number), entry.file)
            records = _shard_records(shard, manifest.compression, uri)
            if len(records) != entry.records:
                raise SpanUnreadable(f"{uri} cannot be rebuilt: shard {shard} holds {len(records)} records "
                                     f"where the manifest says {entry.records}; restore the span from a backup")
            try:
                for line, exact in pool.map(_line, count(), records, repeat(entry.split), repeat(sources),
                                            repeat(manifest.max_side)):
                    kept.append(line)
                    stored_only += not exact
            except _Unindexable as error:
                raise SpanUnreadable(f"{uri} cannot be rebuilt: {error} in shard {shard}; restore the span "
                                     "from a backup") from None
    stored = _store(uri, kept, os.path.join(workdir, f"{number}.tsv.gz"))
    note = f" ({stored_only} of them from their stored bytes alone: their source files are gone, changed or " \
           "not in the manifest, so an exact copy of one that ingest re-encoded is caught as a near-duplicate " \
           "only)" if stored_only else ""
    kept_at = "" if stored == uri else f"; kept for this run in {stored}, since the span cannot be written"
    print(printable(f"stoke: warning: {uri}: {why}; rebuilt from the {len(kept)} records of span {number}'s shards"
                    f"{note}{kept_at}"), file=sys.stderr, flush=True)
    return stored


def _shard_records(shard: str, compression: str, index_uri: str) -> list[bytes]:
    """Every record of one shard, each frame's CRCs checked (at most one shard's size in memory)."""
    try:
        fs, path = filesystem(shard)
        with fs.open(path, "rb") as raw:
            if compression == "gzip":
                with gzip.open(raw) as stream:
                    return list(read_records(stream))
            data = raw.read()
        return list(read_records(io.BytesIO(zlib.decompress(data) if compression == "zlib" else data)))
    except (BadRecord, OSError, EOFError, zlib.error) as error:
        raise SpanUnreadable(f"{index_uri} cannot be rebuilt: shard {shard} is corrupt "
                             f"({error or type(error).__name__}); restore the span from a backup") from None


class _Unindexable(ValueError):
    """A record that is no image ingest would have stored."""


def _line(index: int, record: bytes, split: str, sources: dict, max_side: int | None) -> tuple[dict, bool]:
    """Record `index`'s signature, and whether it is exactly the one ingest computed."""
    try:
        features = example_bytes(record)
        encoded, uri, label = features[ENCODED], features[SOURCE].decode(), features[TEXT].decode()
    except (ValueError, KeyError) as error:
        raise _Unindexable(f"record {index} is not one of ingest's tf.Examples ({error})") from None
    identity = sources.get(uri)
    kept_as_it_came = bool(identity) and len(encoded) == identity[0]
    found = None if kept_as_it_came else _from_source(uri, identity, encoded, max_side)
    try:
        sha, dhash = found or (sha256(encoded), normalize(encoded, max_side).pixels.dhash)
    except Rejected as error:
        raise _Unindexable(f"record {index} holds no image ingest would store ({error})") from None
    name = recorded(uri) if is_uri(uri) else uri  # a span published before may hold SOURCE's password or a query
    return {"sha256": sha, "dhash": dhash, "split": split, "label": label, "uri": name}, kept_as_it_came or bool(found)


def _from_source(uri: str, identity: tuple[int, str] | None, encoded: bytes, max_side: int | None):
    """(SHA-256, dHash) as ingest computed them from the source file, when it still has the size and
    version the manifest records and normalizes to exactly `encoded`; else None."""
    if identity is None:
        return None
    # A local path is literal, as ingest reads it; a URI is read with SOURCE's credentials, as ingest reads it.
    fs, path = filesystem(SourceCredentials.of_workers().reveal(uri)) if is_uri(uri) else (LOCAL, uri)
    try:
        info = fs.info(path)
        if info.get("type") != "file" or (int(info["size"]), version_of(info)) != identity:
            return None
        data = fs.cat_file(path)
        image = normalize(data, max_side)
    except Exception:  # gone, unreadable, no longer an image: only the stored bytes are left
        return None
    return (sha256(data), image.pixels.dhash) if image.encoded == encoded else None


def _store(uri: str, kept: list[dict], local: str) -> str:
    try:
        write_index(uri, kept)
        return uri
    except OSError:  # a reader may hold ROOT without the right to write it
        write_index(local, kept)
        return local
