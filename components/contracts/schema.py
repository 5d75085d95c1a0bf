"""The record and serving contracts of docs/layout.md (Records): tf.Example features (ImageNet-style keys, as in
TensorFlow's ImageNet TFRecords; a span is no TFDS dataset) and the signatures of every exported model.

`encode_example` writes the wire format directly, so the ingest workers build records without
importing TensorFlow (seconds of start-up and half a gigabyte per worker), and `example_bytes`
reads the bytes features back the same way, for the readers that must not import it either.
Tests check both against `tf.train.Example` and `tf.io.parse_single_example`.
"""
from __future__ import annotations

from functools import lru_cache

ENCODED = "image/encoded"
FORMAT = "image/format"
HEIGHT = "image/height"
WIDTH = "image/width"
LABEL = "image/class/label"
TEXT = "image/class/text"
SOURCE = "image/source"

SPLITS = ("train", "eval")

# Images with more pixels are refused by ingest (its default) and by the serving signature, before
# decoding: a 657 KB PNG can declare 13000x13000 pixels, 3 GB and seconds of CPU to decode.
MAX_MEGAPIXELS = 50

# The serving signature: encoded images in (TF Serving's REST API takes them as {"b64": ...}), and
# each output with its dtype and rank. A second signature takes serialized tf.Examples, for TFMA.
SERVING_SIGNATURE = "serving_default"
SERVING_INPUT = "image_bytes"
SERVING_OUTPUTS = {"probabilities": ("float32", 2), "class_ids": ("int64", 1), "labels": ("string", 1)}
EXAMPLES_SIGNATURE = "examples"
EXAMPLES_INPUT = "examples"


def encode_example(
    *, encoded: bytes, image_format: str, height: int, width: int, label: int, text: str, source: str
) -> bytes:
    """Serializes one image record as a tf.train.Example protocol buffer: its parts gathered with their
    length prefixes and joined once, so the image's bytes are copied once (ingest makes one per image)."""
    parts = [*_entry(ENCODED, 1, encoded), _small(FORMAT, 1, image_format.encode()), _small(HEIGHT, 3, _varint(height)),
             _small(WIDTH, 3, _varint(width)), _small(LABEL, 3, _varint(label)), _small(TEXT, 1, text.encode()),
             *_entry(SOURCE, 1, source.encode())]
    return b"".join([_header(1, sum(map(len, parts))), *parts])  # Example.features


def feature_spec() -> dict:
    """The parsing spec for `tf.io.parse_example` (imports TensorFlow on first use)."""
    import tensorflow as tf

    return {
        ENCODED: tf.io.FixedLenFeature([], tf.string),
        FORMAT: tf.io.FixedLenFeature([], tf.string),
        HEIGHT: tf.io.FixedLenFeature([], tf.int64),
        WIDTH: tf.io.FixedLenFeature([], tf.int64),
        LABEL: tf.io.FixedLenFeature([], tf.int64),
        TEXT: tf.io.FixedLenFeature([], tf.string),
        SOURCE: tf.io.FixedLenFeature([], tf.string),
    }


def example_bytes(data: bytes) -> dict[str, bytes]:
    """The first value of each bytes feature of a serialized tf.Example (int64 and float features are
    left out); ValueError for bytes that are not a tf.Example."""
    found = {}
    for features in (payload for number, payload in _fields(data) if number == 1):  # Example.features
        for entry in (payload for number, payload in _fields(features) if number == 1):  # the map's entries
            parts = dict(_fields(entry))  # key = 1, Feature = 2
            lists = dict(_fields(parts.get(2, b"")))  # Feature: bytes_list = 1, float_list = 2, int64_list = 3
            if 1 in parts and 1 in lists:
                values = [value for number, value in _fields(lists[1]) if number == 1]
                found[parts[1].decode("utf-8")] = values[0] if values else b""
    return found


# Protocol buffer wire format: a length-delimited field is tag, length, payload; see
# https://protobuf.dev/programming-guides/encoding/. Feature is a oneof of
# bytes_list = 1, float_list = 2, int64_list = 3; each list keeps its values in field 1.


def _entry(key: str, kind: int, value: bytes) -> tuple[bytes, bytes]:
    """One entry of the Features map, key -> Feature{kind: list{value}}, as (everything before `value`, `value`):
    the entry's key is field 1, its Feature field 2; a packed int64 list holds its varints as one value."""
    inner = _header(1, len(value))  # the list's field 1
    feature = _header(kind, len(inner) + len(value))
    head = _KEYS[key] + _header(2, len(feature) + len(inner) + len(value)) + feature + inner
    return _header(1, len(head) + len(value)) + head, value  # Features.feature (a map entry): field 1


@lru_cache(maxsize=4096)
def _small(key: str, kind: int, value: bytes) -> bytes:
    """A short feature's entry: a span's formats, sizes and labels come again and again."""
    return b"".join(_entry(key, kind, value))


def _header(number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field."""
    return _varint(number << 3 | 2) + _varint(length)


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return _BYTES[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_BYTES = tuple(bytes((i,)) for i in range(0x80))
_KEYS = {key: _header(1, len(key)) + key.encode() for key in (ENCODED, FORMAT, HEIGHT, WIDTH, LABEL, TEXT, SOURCE)}


def _fields(data: bytes):
    """(field number, payload) of each length-delimited field in `data`; other wire types are
    skipped (varint, 64-bit, 32-bit), a truncated or malformed message is a ValueError."""
    position = 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            _, position = _read_varint(data, position)
        elif kind in (1, 5):
            position += 8 if kind == 1 else 4
        elif kind == 2:
            length, position = _read_varint(data, position)
            if position + length > len(data):
                raise ValueError("a field runs past the end of the message")
            yield number, data[position:position + length]
            position += length
        else:
            raise ValueError(f"wire type {kind} is not one a tf.Example holds")
    if position > len(data):
        raise ValueError("the message ends inside a field")


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("a truncated or overlong varint")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position
