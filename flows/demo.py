"""Demo data that is real: scikit-learn's bundled handwritten digits as PNG files in class folders.

The 1,797 digits ship inside scikit-learn, so nothing is downloaded. Each 8x8 scan (values 0-16)
is scaled to 8 bits and enlarged to 32x32 so it looks like an image and not a thumbnail.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from components.common.files import filesystem, join

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def write_digits(target: str, size: int = 32, limit: int | None = None) -> int:
    """Writes the digits under `target/<name>/digit-NNNN.png`; files already there are left alone,
    so a second run adds nothing for the ingest job to pick up. Returns how many the folder holds."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    fs, base = filesystem(target)
    count = 0
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        if limit is not None and count >= limit:
            break
        count += 1
        path = join(base, NAMES[label], f"digit-{index:04d}.png")
        if fs.exists(path):
            continue
        gray = np.clip(pixels * (255 / 16), 0, 255).astype(np.uint8)
        image = Image.fromarray(gray, "L").resize((size, size), Image.BILINEAR).convert("RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, buffer.getvalue())
    return count
