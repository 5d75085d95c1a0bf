"""Camera-sized photo sets in class folders, made from the pictures scikit-image ships (nothing is downloaded).

Each class is one picture (astronaut, coffee, chelsea, rocket, ...); each photo a random crop of it
(a sixteenth to all of the largest 4:3 window, anywhere in the picture), upscaled to a camera's size,
maybe mirrored, a quarter of them black and white, with more or less contrast, brighter or darker,
tinted, with sensor noise, saved as a JPEG of quality 85-95. Two
sets made with different seeds share no photo, so one can train and the other hold out: the classes
are learnable (each picture has its colours and shapes) but not trivial (a close crop of the
astronaut's suit and one of the rocket's gantry share little with the whole picture).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

PICTURES = ("astronaut", "coffee", "chelsea", "rocket")
# Other pictures, for a second task (e.g. a backbone pretrained on other classes).
OTHER_PICTURES = ("camera", "coins", "moon", "page", "text", "horse", "hubble_deep_field", "immunohistochemistry",
                  "logo", "clock", "grass", "gravel", "brick")


def picture(name: str) -> np.ndarray:
    """One of scikit-image's pictures as 8-bit RGB."""
    import skimage.data

    pixels = np.asarray(getattr(skimage.data, name)())
    if pixels.dtype != np.uint8:
        pixels = (255 * (pixels.astype(np.float32) / max(float(pixels.max()), 1e-6))).astype(np.uint8)
    if pixels.ndim == 2:
        pixels = np.stack([pixels] * 3, -1)
    return pixels[..., :3]


def make_photo_set(folder: Path, per_class: int, seed: int, size: tuple[int, int] = (1600, 1200),
                   pictures: tuple[str, ...] = PICTURES) -> list[tuple[Path, str]]:
    """`per_class` JPEGs of `size` (width, height) per picture under folder/<picture>/; returns [(path, class)]."""
    rng = np.random.default_rng(seed)
    width, height = size
    noise = rng.normal(0, 1, (height, width, 3)).astype(np.float32)
    made = []
    for name in pictures:
        photo = picture(name)
        rows, cols = photo.shape[:2]
        full = min(rows / 3, cols / 4)  # the largest 4:3 window, in units of (4, 3)
        (Path(folder) / name).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            scale = full * np.sqrt(rng.uniform(1 / 16, 1.0))  # a sixteenth to all of the window's area
            crop_w, crop_h = int(4 * scale), int(3 * scale)
            top, left = int(rng.integers(0, rows - crop_h + 1)), int(rng.integers(0, cols - crop_w + 1))
            image = Image.fromarray(photo[top:top + crop_h, left:left + crop_w]).resize((width, height), Image.BICUBIC)
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = np.asarray(image, np.float32)
            if rng.random() < 0.25:  # a black-and-white photo: the shapes without the colours
                pixels = np.repeat(pixels.mean(-1, keepdims=True), 3, -1)
            mean = pixels.mean()
            pixels = ((pixels - mean) * rng.uniform(0.6, 1.4) + mean) * rng.uniform(0.6, 1.4) * rng.uniform(0.85, 1.15, 3)
            shifted = np.roll(noise, (int(rng.integers(height)), int(rng.integers(width))), axis=(0, 1))
            pixels = np.clip(pixels + shifted * rng.uniform(3, 10), 0, 255).astype(np.uint8)
            path = Path(folder) / name / f"{name}-{seed}-{index:04d}.jpg"
            Image.fromarray(pixels).save(path, quality=int(rng.integers(85, 96)))
            made.append((path, name))
    return made
