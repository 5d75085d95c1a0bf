"""TFRecord framing without TensorFlow: length, masked CRC32C of the length, data, masked CRC32C of
the data (https://www.tensorflow.org/tutorials/load_data/tfrecord#tfrecords_format_details).

One framing for every TFRecord Stoke writes: the span shards (in Beam workers, where importing
TensorFlow costs seconds and memory) and TF Serving's warm-up requests.
"""
from __future__ import annotations

import struct

import google_crc32c


def frame(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return b"".join((length, _masked_crc(length), record, _masked_crc(record)))


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
