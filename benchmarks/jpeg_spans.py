"""Photo-like JPEGs in class folders and a published span of them, for the input/train benchmarks.

The span is written directly (TFRecordWriter + the schema, manifest last) rather than through the
Beam job, so these benchmarks measure reading only and start in seconds.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from components import layout, schema  # noqa: E402


def make_photos(folder: Path, count: int, width: int = 320, height: int = 240, classes: int = 10) -> list:
    """JPEGs (quality 90) with smooth shapes plus sensor noise; returns [(path, label)]."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    made = []
    for i in range(count):
        fx, fy = rng.uniform(0.01, 0.08, 2)
        phase = rng.uniform(0, 6.3)
        base = np.stack([np.sin(x * fx + phase), np.cos(y * fy - phase), np.sin((x + y) * fx * fy * 20)], -1)
        pixels = np.clip((base + 1) * 110 + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        label = i % classes
        path = folder / f"class{label}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, quality=90)
        made.append((path, label))
    return made


def write_span(root: str, photos: list, shards: int = 8, eval_every: int = 10, number: int = 1,
               compression: str = "gzip") -> dict:
    """Writes span `number` under root: every `eval_every`-th photo to eval, the rest to train."""
    import tensorflow as tf

    labels = sorted({p.parent.name for p, _ in photos})
    base = layout.Root(root)
    folder = base.span(number)
    Path(folder).mkdir(parents=True, exist_ok=True)
    splits = {"train": [p for i, p in enumerate(photos) if i % eval_every],
              "eval": [p for i, p in enumerate(photos) if not i % eval_every]}
    entries = []
    for split, items in splits.items():
        count = shards if split == "train" else 1
        for index in range(count):
            name = layout.shard_name(split, index, count, compression)
            part = items[index::count]
            with tf.io.TFRecordWriter(layout.join(folder, name), layout.TF_COMPRESSION[compression]) as writer:
                for path, label in part:
                    with Image.open(path) as image:
                        width, height = image.size
                    writer.write(schema.encode_example(
                        encoded=path.read_bytes(), image_format="jpeg", height=height, width=width,
                        label=label, text=labels[label], source=str(path)))
            entries.append({"file": name, "split": split, "records": len(part),
                            "bytes": Path(layout.join(folder, name)).stat().st_size})
    manifest = {"span": number, "created": "2025-01-01T00:00:00Z", "compression": compression, "source": "benchmark",
                "counts": {"train": len(splits["train"]), "eval": len(splits["eval"]), "dead_letter": 0},
                "labels": labels, "shards": entries, "sources": []}
    layout.write_json(base.labels, labels)
    layout.write_json(layout.join(folder, layout.MANIFEST), manifest)
    return manifest
