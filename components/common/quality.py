"""Quality scores of one image, from the decode ingest does anyway, on a thumbnail of at most 64 px.

The measures are cleanvision's (the open tool for finding issues in image datasets), taken from a
64 px thumbnail as cleanvision takes its blur measure, so a few thousand pixels are counted per image
whatever its size; beam_jobs/quality.py judges them against the settings:

- sharpness: the variance of the Laplacian (Pech-Pacheco et al., "Diatom autofocusing in brightfield
  microscopy: a comparative study", ICPR 2000), with PIL's 8-neighbour FIND_EDGES kernel as cleanvision
  applies it (negative responses clipped at 0). A de-focused or shaken picture has few edges.
- spread: the standard deviation of the 256 counts of the grey histogram; cleanvision calls a
  concentrated histogram (a plain, low-contrast picture) low-information, not blurry.
- brightness: the 99th and 5th percentiles of the perceived brightness sqrt(.241 R^2 + .691 G^2 +
  .068 B^2) / 255 (HSP, as cleanvision): dark when even the brightest pixels are dim, light when even
  the darkest are bright.
- entropy: of the grey histogram of the image as decoded, in bits (0 for one grey level, 8 at most):
  little information (a thumbnail's averaging would add grey levels that are not in the picture).
- colour: the largest difference between a pixel's channels: 0-2 is a grey picture stored as RGB.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

SIDE = 64  # longer side of the thumbnail the scores are taken from
# HSP brightness^2 per channel value, in thousandths (int64): three table look-ups a pixel, no floats.
SQUARES = [np.round(weight * 1000 * np.arange(256, dtype=np.int64) ** 2).astype(np.int64) for weight in (0.241, 0.691, 0.068)]


@dataclass(frozen=True)
class Scores:
    sharpness: float  # variance of the Laplacian of the grey thumbnail
    spread: float  # std of the grey histogram's counts
    dark: float  # 99th percentile of brightness, 0-1
    light: float  # 5th percentile of brightness, 0-1
    entropy: float  # bits, of the grey histogram
    colour: int  # largest channel difference of any pixel, 0-255

    def as_dict(self) -> dict:
        return {"sharpness": self.sharpness, "spread": self.spread, "dark": self.dark, "light": self.light,
                "entropy": self.entropy, "colour": self.colour}


LEVELS = np.arange(256, dtype=np.float64)


def moments(histogram: list[int]) -> tuple[float, float]:
    """Mean and variance of a grey image from its 256-bin histogram (ImageStat's, without its Python loops)."""
    counts = np.asarray(histogram, dtype=np.float64)
    total = counts.sum()
    mean = float(counts @ LEVELS) / total
    return mean, max(0.0, float(counts @ (LEVELS * LEVELS)) / total - mean * mean)


def scores_of(image: Image.Image, grey: Image.Image, counts: np.ndarray | None = None) -> Scores:
    """The scores of `image` (RGB, as decoded) and its grey version: entropy from the grey image as
    decoded, the rest from a thumbnail of at most SIDE px. PIL's C code does the pixel loops."""
    counts = np.asarray(grey.histogram() if counts is None else counts, dtype=np.float64)
    shares = counts[counts > 0] / counts.sum()
    if max(image.size) > SIDE:
        ratio = SIDE / max(image.size)
        image = image.resize((max(1, round(image.width * ratio)), max(1, round(image.height * ratio))), Image.BILINEAR,
                             reducing_gap=2.0)
    thumb = image.convert("L")
    rgb = np.asarray(image.convert("RGB"))
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    colour = int((np.maximum(np.maximum(r, g), b) - np.minimum(np.minimum(r, g), b)).max())
    square = SQUARES[0][r] + SQUARES[1][g] + SQUARES[2][b]  # brightness^2 x 1000, exact in integers
    k99, k5 = (min(square.size - 1, int(q * (square.size - 1))) for q in (0.99, 0.05))
    high, low = np.partition(square.ravel(), (k5, k99))[[k99, k5]]
    return Scores(sharpness=round(moments(thumb.filter(ImageFilter.FIND_EDGES).histogram())[1], 2),
                  spread=round(float(np.std(thumb.histogram())), 2),
                  dark=round(float(np.sqrt(high / 1000)) / 255, 4), light=round(float(np.sqrt(low / 1000)) / 255, 4),
                  entropy=round(float(-(shares * np.log2(shares)).sum()), 3), colour=colour)
