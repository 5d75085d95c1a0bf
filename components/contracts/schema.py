"""The record and serving contracts of DESIGN.md: tf.Example features (ImageNet/TFDS names) and
the signatures of every exported model.

`encode_example` writes the wire format directly, so the ingest workers build records without
importing TensorFlow (seconds of start-up and half a gigabyte per worker). Tests check the bytes
against `tf.train.Example` and `tf.io.parse_single_example`.
"""
from __future__ import annotations

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
    """Serializes one image record as a tf.train.Example protocol buffer."""
    features = b"".join(
        _field(1, _field(1, key.encode()) + _field(2, value))
        for key, value in (
            (ENCODED, _bytes_feature(encoded)),
            (FORMAT, _bytes_feature(image_format.encode())),
            (HEIGHT, _int64_feature(height)),
            (WIDTH, _int64_feature(width)),
            (LABEL, _int64_feature(label)),
            (TEXT, _bytes_feature(text.encode())),
            (SOURCE, _bytes_feature(source.encode())),
        )
    )
    return _field(1, features)  # Example.features


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


# Protocol buffer wire format: a length-delimited field is tag, length, payload; see
# https://protobuf.dev/programming-guides/encoding/. Feature is a oneof of
# bytes_list = 1, float_list = 2, int64_list = 3; each list keeps its values in field 1.


def _bytes_feature(value: bytes) -> bytes:
    return _field(1, _field(1, value))


def _int64_feature(value: int) -> bytes:
    return _field(3, _field(1, _varint(value)))  # a packed repeated int64 with one value


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
