"""Photo-like JPEGs in class folders and a published span of them, for the benchmarks.

The span comes from the real ingest job (a few seconds for a few thousand images), so the
benchmarks read exactly what training reads.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from beam_jobs.ingest import ingest
from components.contracts.run_config import RunConfig


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


def make_alike_photos(folder: Path, count: int, width: int = 320, height: int = 240, classes: int = 10) -> list:
    """JPEGs (quality 90) of what a fixed camera sees and dHash's 9x8 thumbnail cannot tell apart: the same
    horizontal gradient, each in a random colour, with sensor noise; returns [(path, label)]."""
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    made = []
    for i in range(count):
        pixels = np.clip(ramp * rng.uniform(40, 255, 3) + rng.normal(0, 8, (height, width, 3)), 0, 255)
        label = i % classes
        path = folder / f"class{label}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
        made.append((path, label))
    return made


def packaged_photos() -> list[np.ndarray]:
    """The photographs scikit-image and scikit-learn ship (nothing is downloaded), as RGB arrays."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    photos = [getattr(data, name)() for name in ("astronaut", "coffee", "chelsea", "rocket")]
    return [p[..., :3] for p in photos + list(load_sample_images().images)]


def make_camera_photos(folder: Path, count: int, width: int = 2000, height: int = 1500, classes: int = 10) -> list:
    """JPEGs (quality 90) the size of a camera's, each a different random crop of a packaged photo,
    upscaled, maybe mirrored, tinted and given sensor noise; returns [(path, label)].

    The noise puts back the fine detail that upscaling smooths away, so the files weigh about what a
    camera's do (0.7 MB at 2000x1500): decoding and compression costs follow the bytes."""
    rng = np.random.default_rng(0)
    photos = packaged_photos()
    noise = rng.normal(0, 6, (height, width, 3)).astype(np.float32)
    made = []
    for i in range(count):
        photo = photos[i % len(photos)]
        rows, cols = photo.shape[:2]
        scale = rng.uniform(0.6, 1.0) * min(rows / height, cols / width)
        crop_h, crop_w = int(height * scale), int(width * scale)
        top, left = rng.integers(0, rows - crop_h + 1), rng.integers(0, cols - crop_w + 1)
        image = Image.fromarray(photo[top:top + crop_h, left:left + crop_w]).resize((width, height), Image.BICUBIC)
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        shifted = np.roll(noise, (rng.integers(height), rng.integers(width)), axis=(0, 1))
        pixels = np.clip(np.asarray(image, np.float32) * rng.uniform(0.85, 1.15, 3) + shifted, 0, 255)
        label = i % classes
        path = folder / f"class{label}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
        made.append((path, label))
    return made


def write_span(root: str, source: Path, compression: str = "gzip", **settings) -> dict:
    """Ingests `source` into a new span under `root` (ingest's defaults unless told) and returns the
    job's summary."""
    config = RunConfig(source=str(source), root=root, ingest={"compression": compression, **settings})
    return ingest(config, [])
