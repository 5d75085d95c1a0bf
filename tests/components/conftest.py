"""Small spans written the way the ingest job publishes them: GZIP shards, then _MANIFEST.json."""
from __future__ import annotations

import hashlib
import io
import os

import numpy as np
import pytest
from PIL import Image

from components.common import files
from components.common.files import write_json
from components.common.spans import Spans
from components.contracts import layout, schema
from components.contracts.results import SpanManifest

TRAIN_LABELS = ["red", "green", "blue"]


def tiny_image(label: int, index: int, size: int = 32, image_format: str = "jpeg") -> bytes:
    """A noisy image whose dominant colour channel is its label: learnable in a few steps."""
    rng = np.random.default_rng(index)
    pixels = rng.integers(0, 90, size=(size, size + 8, 3), dtype=np.uint8)
    pixels[..., label] = rng.integers(170, 255, size=(size, size + 8), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG" if image_format == "jpeg" else "PNG", quality=90)
    return buffer.getvalue()


def write_span(root: str, number: int, splits: dict[str, list[tuple[bytes, str, int]]],
               labels: list[str], shards_per_split: dict[str, int], publish: bool = True, checked: bool = True) -> dict:
    """Writes span-NNNNN with GZIP shards round-robin per split; the manifest last (if publish), and
    its statistics and a data-check record letting it in (if checked: training reads no span the data
    check has not let in, and the check compares a new span with the statistics of those it let in)."""
    import tensorflow as tf

    from beam_jobs.statistics import write_statistics

    base = layout.Root(root)
    folder = base.span(number)
    files.filesystem(folder)[0].makedirs(folder, exist_ok=True)
    shards, signed = [], []
    for split, records in splits.items():
        count = shards_per_split[split]
        for index in range(count):
            name = layout.shard_name(split, index, count)
            part = records[index::count]
            with tf.io.TFRecordWriter(files.join(folder, name), "GZIP") as writer:
                for position, (encoded, image_format, label) in enumerate(part):
                    height, width = tf.image.decode_image(encoded).shape[:2]
                    source = f"mem://{split}/{index}/{position}"
                    writer.write(schema.encode_example(
                        encoded=encoded, image_format=image_format, height=int(height), width=int(width),
                        label=label, text=labels[label], source=source))
                    signed.append({"uri": source, "split": split, "label": labels[label], "format": image_format,
                                   "bytes": len(encoded), "width": int(width), "height": int(height),
                                   "mean": 100.0, "std": 20.0})
            data = files.filesystem(folder)[0].cat_file(files.join(folder, name))
            shards.append({"file": name, "split": split, "records": len(part), "bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()})
    manifest = SpanManifest(span=number, created="2025-01-01T00:00:00Z", source="mem://", labels=labels,
                            counts={split: len(splits.get(split, [])) for split in schema.SPLITS}
                            | {"dead_letter": 0, "duplicates": 0},
                            shards=shards, sources=[])
    if publish:
        files.write_json(base.labels, labels)
        write_json(base.manifest(number), manifest.to_json())
    if publish and checked:
        write_statistics(base, number, signed, [], labels)
        let_in(root, number)
    return manifest.to_json()


def let_in(root: str, number: int) -> None:
    """Records that the data check found span `number` fine, as `stoke datacheck` would."""
    from components.contracts.summaries import DATACHECK_VERSION, DataCheckRecord

    base = layout.Root(root)
    record = DataCheckRecord(span=number, check_version=DATACHECK_VERSION, status="ok", checked_at="2025-01-01T00:00:00Z",
                             reasons=[], anomalies=[], manifest_sha256=Spans(base).manifest_sha256(number))
    write_json(base.datacheck(number), record.to_json())


def relabel(path: str, label: int) -> None:
    """Rewrites a GZIP shard with each of its records labelled `label`: records that read, not those published."""
    import gzip

    import tensorflow as tf

    from components.common.tfrecord import frame, shard_records

    records = []
    for record in shard_records(path, "gzip"):
        example = tf.train.Example.FromString(record)
        example.features.feature[schema.LABEL].int64_list.value[:] = [label]
        records.append(frame(example.SerializeToString()))
    with open(path, "wb") as f:
        f.write(gzip.compress(b"".join(records)))


def fake_model(folder, payload_mb: int = 0) -> str:
    """A folder shaped like a SavedModel; `payload_mb` makes copying it take a while."""
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"graph")
    (folder / "fingerprint.pb").write_bytes(b"fp")
    (folder / "variables" / "variables.index").write_bytes(b"index")
    (folder / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(1 << 20) * max(payload_mb, 1))
    return str(folder)


def tiny_records(count: int, offset: int = 0, size: int = 32) -> list[tuple[bytes, str, int]]:
    """Mixed JPEG (3 of 4) and PNG records cycling through the labels."""
    records = []
    for i in range(offset, offset + count):
        image_format = "png" if i % 4 == 3 else "jpeg"
        label = i % len(TRAIN_LABELS)
        records.append((tiny_image(label, i, size, image_format), image_format, label))
    return records


@pytest.fixture(scope="session")
def small_spans_root(tmp_path_factory) -> str:
    """ROOT with span 1 (48 train in 3 shards, 19 eval in 1: no whole number of batches of 8 or 16)
    and an unpublished span 2."""
    root = str(tmp_path_factory.mktemp("train-root"))
    write_span(root, 1, {"train": tiny_records(48), "eval": tiny_records(19, offset=1000)},
               TRAIN_LABELS, {"train": 3, "eval": 1})
    write_span(root, 2, {"train": tiny_records(8, offset=2000)}, TRAIN_LABELS, {"train": 1}, publish=False)
    return root
