"""TFRecord files written through fsspec, so one writer serves local folders, s3:// and gs://.

TensorFlow's own writer cannot reach S3 without tensorflow-io, and importing TensorFlow in every
Beam worker costs seconds and memory; records are framed by components/common/tfrecord.py.

Compression goes through ISA-L, which writes the same DEFLATE streams as zlib. On JPEG bytes,
which are entropy-coded already, zlib spends about half of an image's ingest time to save under 1%;
ISA-L saves the same at several times the speed (benchmarks/ingest.py measures both).

A GZIP shard holds each record as a member of its own (RFC 1952, 2.2: a gzip file is a series of
members; TensorFlow's reader, Python's gzip and `gzip -d` read them all), and an uncompressed one is
its frames, so a record's bytes stand alone: near-copies that join their original's split after the
job move to another file as bytes, not by inflating and compressing every shard they touch (1.8 s of
2.4 s of settling 6,000 small JPEGs, docs/benchmarks.md#ingest). The price is what members cannot
share, the JPEG headers that a stream finds again in the next record: 1.9% of the bytes of 30 KB
JPEGs, 0.1% of photos stored at 512 px. ZLIB allows one stream a file (TensorFlow
reads no further), so its records are rewritten when they move.

TensorFlow's GZIP reader reads a file 256 KiB at a time (ZlibInputStream, in tensorflow/tensorflow
third_party/xla/xla/tsl/lib/io/zlib_inputstream.cc; the buffer is ZlibCompressionOptions' input_buffer_size,
which no Python reader sets). When inflate ends a member and gives no data, it reads more input, and
ReadFromStream takes a read that brings nothing for the end of the file even while bytes it read before
wait in its buffer. That happens when its last read (the one that reaches the file's end) starts among a
member's last bytes that inflate to nothing, its 8-byte trailer and at most 2 bytes of end-of-block code
before it: after that member, TensorFlow 2.21 reads nothing more of the file, without an error (Python's
gzip, `gzip -d` and Beam's reader read on). So a member is written not to end 1 to QUIET_END bytes past a
multiple of READ_STEP: where it would, its header takes an extra field of a few bytes (`placed`).

Each file's SHA-256 is taken over the bytes as they are written, which are the whole file: the manifest
records what ingest wrote (a cached copy must match it), at no second read of the shard from its store,
and a store that later returns other bytes fails that check instead of becoming the record.
"""
from __future__ import annotations

import hashlib
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import fsspec
from isal import isal_zlib

from components.common.files import filesystem, join, writing
from components.common.tfrecord import frame

WINDOW_BITS = {"gzip": 16 + 15, "zlib": 15}  # 16+ asks for the gzip header and trailer
LEVEL = isal_zlib.ISAL_DEFAULT_COMPRESSION
FRAMING = 16  # bytes a frame adds to its record: length, its CRC, the data's CRC
READ_STEP = 64 << 10  # TensorFlow reads GZIP 256 KiB at a time; a step of 64 KiB covers 64 and 128 KiB as well
QUIET_END = 16  # a member's last bytes that may inflate to nothing: trailer and end-of-block code (at most 10)
FEXTRA = 4  # the header's flag of an extra field (RFC 1952, 2.3.1)
THREADS = 2  # shards settled at once after the job (beam_jobs/duplicates.py): each is in memory meanwhile


class RecordFile:
    """One TFRecord file being written; `close()` returns what it holds, with `starts`: where each
    record's unit (its GZIP member, else its frame; in a ZLIB file, in the stream it inflates to) begins."""

    def __init__(self, uri: str, compression: str):
        self.uri, self.compression, self.records, self.raw_bytes = uri, compression, 0, 0
        self.starts: list[int] = []
        self._raw = fsspec.open(uri, "wb").open()
        self._digest = hashlib.sha256()
        self._offset = 0
        self._stream = isal_zlib.compressobj(LEVEL, isal_zlib.DEFLATED, WINDOW_BITS["zlib"]) \
            if compression == "zlib" else None

    def write(self, record: bytes) -> None:
        self.add(unit(record, self.compression))

    def add(self, unit: bytes) -> None:
        """Appends one record's unit as a file of this compression holds it (see `units`)."""
        if self.compression == "gzip":
            unit = placed(unit, self._offset)
        self.starts.append(self._offset)
        self._offset += len(unit)
        self.records += 1
        self.raw_bytes += record_size(unit, self.compression)
        self._put(self._stream.compress(unit) if self._stream else unit)

    def _put(self, data: bytes) -> None:
        with writing(self.uri):  # a full disk's error, which fsspec's file raises without it, names the shard
            self._raw.write(data)
        self._digest.update(data)

    def close(self) -> dict:
        if self._stream is not None:
            self._put(self._stream.flush())
        with writing(self.uri):
            self._raw.close()
        fs, path = filesystem(self.uri)
        return {"file": self.uri, "records": self.records, "bytes": fs.size(path), "sha256": self._digest.hexdigest(),
                "starts": self.starts}


def unit(record: bytes, compression: str) -> bytes:
    """A record as a file of `compression` holds it: its frame, as a GZIP member of its own for gzip (in a
    ZLIB file the stream compresses the frames)."""
    data = frame(record)
    return isal_zlib.compress(data, LEVEL, WINDOW_BITS["gzip"]) if compression == "gzip" else data


def placed(member: bytes, offset: int) -> bytes:
    """A GZIP member as it is written at `offset`: itself, or where it would end 1 to QUIET_END bytes past a
    multiple of READ_STEP, with an extra field in its header (a subfield "St" of zeros; readers skip fields
    they do not know) that takes it past them. A member that comes from another file (a record that moves,
    or stays in a pruned copy) is placed again: the field it had there is dropped first."""
    if member[3] & FEXTRA:  # only `placed` writes one: right after the 10-byte header (RFC 1952, 2.3)
        xlen = int.from_bytes(member[10:12], "little")
        member = b"".join((member[:3], bytes([member[3] & ~FEXTRA]), member[4:10], member[12 + xlen:]))
    past = (offset + len(member)) % READ_STEP
    if not 0 < past <= QUIET_END:
        return member
    added = max(QUIET_END + 1 - past, 6)  # XLEN (2), then the subfield's id (2), its length (2) and its data
    field = (added - 2).to_bytes(2, "little") + b"St" + (added - 6).to_bytes(2, "little") + bytes(added - 6)
    return b"".join((member[:3], bytes([member[3] | FEXTRA]), member[4:10], field, member[10:]))


def record_size(unit: bytes, compression: str) -> int:
    """The length of the record a unit holds: a GZIP member's trailer ends with its data's length (ISIZE)."""
    framed = int.from_bytes(unit[-4:], "little") if compression == "gzip" else len(unit)
    return framed - FRAMING


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
        current, closed = self._current(split)
        current.write(record)
        return closed

    def add(self, split: str, unit: bytes) -> dict | None:
        """`write` for a record's unit as another file of this compression holds it."""
        current, closed = self._current(split)
        current.add(unit)
        return closed

    def _current(self, split: str) -> tuple[RecordFile, dict | None]:
        closed = None
        current = self._open.get(split)
        if current is not None and current.raw_bytes >= self.max_bytes:
            closed = {"split": split, **current.close()}
            current = None
        if current is None:
            name = f"{split}-{uuid.uuid4().hex}.part"
            current = self._open[split] = RecordFile(join(self.folder, name), self.compression)
        return current, closed

    def position(self, split: str) -> tuple[str, int]:
        """The file and index of the last record written to `split`."""
        current = self._open[split]
        return current.uri, current.records - 1

    def close(self) -> list[dict]:
        closed = [{"split": split, **f.close()} for split, f in sorted(self._open.items())]
        self._open.clear()
        return closed


class StagedFileChanged(OSError):
    """A staged file whose bytes are not those the job wrote (its store changed them): nothing is published."""


def units(shard: dict, compression: str) -> list[memoryview]:
    """Each record's unit of one staged file (as RecordFile wrote it and described it, at most one shard's size in
    memory), once the file's bytes are checked against the digest taken as they were written."""
    with fsspec.open(shard["file"], "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != shard["sha256"]:
        raise StagedFileChanged(f"staged file {shard['file']} changed after it was written")
    if compression == "zlib":
        data = isal_zlib.decompress(data, WINDOW_BITS["zlib"])
    view, ends = memoryview(data), [*shard["starts"][1:], len(data)]
    return [view[start:end] for start, end in zip(shard["starts"], ends)]


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
    A record moves as the bytes of its unit (`units`): a tf.Example holds no split.

    The touched shards are read, checked and copied on THREADS threads (hashing and file I/O release
    the GIL), a few at a time so that memory holds at most THREADS shards and the moving units of a few
    more; this thread writes the moving units in shard order."""
    gone: dict[str, set[int]] = {}
    for signature in dropped:
        gone.setdefault(signature["file"], set()).add(signature["index"])
    moving: dict[str, dict[int, str]] = {}
    for signature in moved:
        moving.setdefault(signature["file"], {})[signature["index"]] = signature["split"]
    kept, touched = [], []
    for shard in shards:
        (touched if shard["file"] in gone or shard["file"] in moving else kept).append(shard)
    elsewhere = RollingShards(folder, max_bytes, compression) if moved else None

    def take(settled: Future) -> None:
        copy, moves = settled.result()
        kept.extend([copy] if copy else [])
        for split, unit in moves:
            kept.extend([closed] if (closed := elsewhere.add(split, unit)) else [])

    pending: deque[Future] = deque()
    with ThreadPoolExecutor(THREADS) as pool:
        for shard in touched:
            pending.append(pool.submit(_settle, shard, gone.get(shard["file"], set()), moving.get(shard["file"], {}),
                                       compression))
            if len(pending) > THREADS:
                take(pending.popleft())
        while pending:
            take(pending.popleft())
    return kept + (elsewhere.close() if elsewhere else [])


def _settle(shard: dict, drop: set[int], move: dict[int, str], compression: str) -> tuple[dict | None, list]:
    """One touched shard, then removed: the description of its copy without the records that leave it
    (None when none stays), and (split, unit) of each record that moves."""
    stays = shard["records"] - len(drop | move.keys())
    copy = RecordFile(shard["file"] + ".kept", compression) if stays else None
    moves = []
    if stays or move:
        for index, unit in enumerate(units(shard, compression)):
            if index in move:
                moves.append((move[index], bytes(unit)))  # its own bytes: the shard's are let go
            elif index not in drop:
                copy.add(unit)
    described = {**shard, **copy.close()} if copy is not None else None
    fs, path = filesystem(shard["file"])
    fs.rm(path)
    return described, moves
