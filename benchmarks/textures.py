"""A small, noisy photo dataset from images scikit-image ships: brick, grass and gravel textures.

Each of the three 512x512 grayscale photos is cut into random square crops (64-192 px, so the scale
varies), with random brightness, contrast and Gaussian noise, saved as 96x96 JPEGs under
`target/<texture>/`. Nothing is downloaded. Used by benchmarks/train_recipes.py.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

TEXTURES = ("brick", "grass", "gravel")


def write_textures(target: Path, per_class: int = 100, seed: int = 0, side: int = 96) -> int:
    import skimage.data

    rng = np.random.default_rng(seed)
    for name in TEXTURES:
        photo = getattr(skimage.data, name)().astype(np.float32)
        folder = Path(target) / name
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            size = int(rng.integers(64, 193))
            y, x = (int(v) for v in rng.integers(0, photo.shape[0] - size, 2))
            crop = photo[y:y + size, x:x + size]
            crop = (crop - crop.mean()) * rng.uniform(0.6, 1.4) + crop.mean() + rng.uniform(-40, 40)
            crop = crop + rng.normal(0, rng.uniform(5, 25), crop.shape)
            image = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8), "L").resize((side, side), Image.BILINEAR)
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="JPEG", quality=85)
            (folder / f"{name}-{index:04d}.jpg").write_bytes(buffer.getvalue())
    return per_class * len(TEXTURES)
