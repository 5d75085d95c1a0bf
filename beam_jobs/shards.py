"""TFRecord files written through fsspec, so one writer serves local folders, s3:// and gs://.

TensorFlow's own writer cannot reach S3 without tensorflow-io, and importing TensorFlow in every
Beam worker costs seconds and memory; records are framed by components/common/tfrecord.py.

Compression goes through ISA-L, which writes the same DEFLATE streams as zlib. On JPEG bytes,
which are entropy-coded already, zlib spends about half of an image's ingest time to save under 1%;
ISA-L saves the same at several times the speed (benchmarks/ingest.py measures both).

Each file's SHA-256 is taken over the bytes as they are written, which are the whole file: the manifest
records what ingest wrote (a cached copy must match it), at no second read of the shard from its store,
and a store that later returns other bytes fails that check instead of becoming the record.
"""
from __future__ import annotations

import hashlib
import io
import uuid
from collections.abc import Iterator

import fsspec
from isal import isal_zlib

from components.common import tfrecord
from components.common.files import filesystem, join
from components.common.tfrecord import frame

WINDOW_BITS = {"gzip": 16 + 15, "zlib": 15}  # 16+ asks for the gzip header and trailer


class RecordFile:
    """One TFRecord file being written; `close()` returns what it holds."""

    def __init__(self, uri: str, compression: str):
        self.uri, self.records, self.raw_bytes = uri, 0, 0
        self._raw = fsspec.open(uri, "wb").open()
        self._digest = hashlib.sha256()
        self._codec = None
        if compression != "none":
            self._codec = isal_zlib.compressobj(
                isal_zlib.ISAL_DEFAULT_COMPRESSION, isal_zlib.DEFLATED, WINDOW_BITS[compression])

    def write(self, record: bytes) -> None:
        data = frame(record)
        self._put(self._codec.compress(data) if self._codec else data)
        self.records += 1
        self.raw_bytes += len(record)

    def _put(self, data: bytes) -> None:
        self._raw.write(data)
        self._digest.update(data)

    def close(self) -> dict:
        if self._codec is not None:
            self._put(self._codec.flush())
        self._raw.close()
        fs, path = filesystem(self.uri)
        return {"file": self.uri, "records": self.records, "bytes": fs.size(path), "sha256": self._digest.hexdigest()}


class RollingShards:
    """Per-split files under `folder` that roll over once they hold `max_bytes` of records.

    Each Beam bundle owns its own files, so bounding shard size needs no shuffle of the payloads;
    the driver names the files for good when the job has finished.
    """

    def __init__(self, folder: str, max_bytes: int, compression: str):
        self.folder, self.max_bytes, self.compression = folder, max_bytes, compression
        self._open: dict[str, RecordFile] = {}

    def write(self, split: str, record: bytes) -> dict | None:
        """Writes a record; returns the description of a file it closed to make room, if any."""
        closed = None
        current = self._open.get(split)
        if current is not None and current.raw_bytes >= self.max_bytes:
            closed = {"split": split, **current.close()}
            current = None
        if current is None:
            name = f"{split}-{uuid.uuid4().hex}.part"
            current = self._open[split] = RecordFile(join(self.folder, name), self.compression)
        current.write(record)
        return closed

    def position(self, split: str) -> tuple[str, int]:
        """The file and index of the last record written to `split`."""
        current = self._open[split]
        return current.uri, current.records - 1

    def close(self) -> list[dict]:
        closed = [{"split": split, **f.close()} for split, f in sorted(self._open.items())]
        self._open.clear()
        return closed


def read_records(uri: str, compression: str) -> Iterator[bytes]:
    """The records of one staged file (as RecordFile wrote it; at most one shard's size in memory)."""
    with fsspec.open(uri, "rb") as f:
        data = f.read()
    if compression != "none":
        data = isal_zlib.decompress(data, WINDOW_BITS[compression])
    return tfrecord.read_records(io.BytesIO(data))


def prune(shards: list[dict], dropped: list[dict], compression: str) -> list[dict]:
    """The staged shards without the records `dropped` names (by file and index)."""
    return rearrange(shards, dropped, [], compression, "", 0)


def rearrange(shards: list[dict], dropped: list[dict], moved: list[dict], compression: str, folder: str,
              max_bytes: int) -> list[dict]:
    """The staged shards without the records `dropped` names, and with the records `moved` names (by
    file and index) in the split their signature now says, in new files under `folder`.

    Copies and near-copies are found only once every record is written (beam_jobs/duplicates.py,
    near_copies.py), so a shard holding one is copied without it here: a file that holds nothing
    else is just removed, so a re-upload costs no copying, and a shard with neither is left alone.
    The bytes of a record are moved as they are: a tf.Example holds no split."""
    gone: dict[str, set[int]] = {}
    for signature in dropped:
        gone.setdefault(signature["file"], set()).add(signature["index"])
    moving: dict[str, dict[int, str]] = {}
    for signature in moved:
        moving.setdefault(signature["file"], {})[signature["index"]] = signature["split"]
    kept, elsewhere = [], RollingShards(folder, max_bytes, compression) if moved else None
    for shard in shards:
        drop, move = gone.get(shard["file"], set()), moving.get(shard["file"], {})
        if not drop and not move:
            kept.append(shard)
            continue
        stays = shard["records"] - len(drop | move.keys())
        copy = RecordFile(shard["file"] + ".kept", compression) if stays else None
        if stays or move:
            for index, record in enumerate(read_records(shard["file"], compression)):
                if index in move:
                    kept += [closed] if (closed := elsewhere.write(move[index], record)) else []
                elif index not in drop:
                    copy.write(record)
        if copy is not None:
            kept.append({**shard, **copy.close()})
        fs, path = filesystem(shard["file"])
        fs.rm(path)
    return kept + (elsewhere.close() if elsewhere else [])
