"""TFRecord framing without TensorFlow: length, masked CRC32C of the length, data, masked CRC32C of
the data (https://www.tensorflow.org/tutorials/load_data/tfrecord#tfrecords_format_details).

One framing for every TFRecord Stoke writes: the span shards (in Beam workers, where importing
TensorFlow costs seconds and memory) and TF Serving's warm-up requests; and one checked reader of
it, for ingest's pruning of staged files, the shards the training cache copies from a bucket and the
records the data check's label check reads.
"""
from __future__ import annotations

import gzip
import io
import struct
import zlib
from collections.abc import Iterator

import google_crc32c

from components.common.files import filesystem


def frame(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return b"".join((length, _masked_crc(length), record, _masked_crc(record)))


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


class BadRecord(ValueError):
    """A frame whose length or data fails its CRC, or a file that ends inside a frame."""


def read_records(stream) -> Iterator[bytes]:
    """The records of an uncompressed TFRecord stream, each frame's CRCs checked (BadRecord if not)."""
    count = 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12 or header[8:] != _masked_crc(header[:8]):
            raise BadRecord(f"record {count}: {'truncated' if len(header) < 12 else 'length fails its CRC'}")
        (length,) = struct.unpack("<Q", header[:8])
        data, crc = stream.read(length), stream.read(4)
        if len(data) < length or len(crc) < 4:
            raise BadRecord(f"record {count}: truncated")
        if crc != _masked_crc(data):
            raise BadRecord(f"record {count}: data fails its CRC")
        yield data
        count += 1


def count_records(stream) -> int:
    """Reads every frame of an uncompressed TFRecord stream, checking both CRCs, and counts them."""
    return sum(1 for _ in read_records(stream))


def shard_records(uri: str, compression: str) -> Iterator[bytes]:
    """The records of one span shard (local or fsspec; compression as the manifest names it: gzip, zlib
    or none), streamed, each frame's CRCs checked. A damaged file raises BadRecord naming what failed."""
    fs, path = filesystem(uri)
    try:
        with fs.open(path, "rb") as raw:
            if compression == "gzip":
                with gzip.open(raw) as stream:
                    yield from read_records(stream)
                return
            data = raw.read()  # ZLIB: one stream over the whole file
            yield from read_records(io.BytesIO(zlib.decompress(data) if compression == "zlib" else data))
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise BadRecord(f"{error or type(error).__name__}") from None
