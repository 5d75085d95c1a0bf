"""Photo-like JPEGs in class folders and a published span of them, for the benchmarks.

The span comes from the real ingest job (a few seconds for a few thousand images), so the
benchmarks read exactly what training reads.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from beam_jobs.ingest import ingest
from components.contracts.config import IngestConfig


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


def write_span(root: str, source: Path, compression: str = "gzip") -> dict:
    """Ingests `source` into a new span under `root` and returns the job's summary."""
    config = IngestConfig(source=str(source), root=root, compression=compression)
    return ingest(config, [])
