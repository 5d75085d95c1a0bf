"""Quality scores of one image, from the decode ingest does anyway, on a thumbnail of at most 64 px.

The measures are cleanvision's (the open tool for finding issues in image datasets), taken from a
64 px thumbnail as cleanvision takes its blur measure, so a few thousand pixels are counted per image
whatever its size; beam_jobs/quality.py judges them against the settings:

- sharpness: the variance of the Laplacian (Pech-Pacheco et al., "Diatom autofocusing in brightfield
  microscopy: a comparative study", ICPR 2000), with PIL's 8-neighbour FIND_EDGES kernel as cleanvision
  applies it (negative responses clipped at 0). A de-focused or shaken picture has few edges.
- spread: the standard deviation of the 256 counts of the grey histogram; cleanvision calls a
  concentrated histogram (a plain, low-contrast picture) low-information, not blurry. Its threshold is on
  the counts of a 64 px thumbnail, so a picture smaller than that has its counts scaled to the pixels its
  thumbnail would have: the same picture at 32 px is as concentrated as at 64 (unscaled, a 32x32 picture's
  counts are a quarter, and half the demo's digits, black with white strokes, looked spread out).
- brightness: the 99th and 5th percentiles of the perceived brightness sqrt(.241 R^2 + .691 G^2 +
  .068 B^2) / 255 (HSP, as cleanvision): dark when even the brightest pixels are dim, light when even
  the darkest are bright.
- entropy: of the grey histogram of the image as decoded, in bits (0 for one grey level, 8 at most):
  little information (a thumbnail's averaging would add grey levels that are not in the picture).
- colour: the largest difference between a pixel's channels: 0-2 is a grey picture stored as RGB.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

SIDE = 64  # longer side of the thumbnail the scores are taken from
# HSP brightness^2 in thousandths: 241 R^2 + 691 G^2 + 68 B^2, exact in int32 (at most 1000 x 255^2):
# one product over the thumbnail's pixels, no floats.
WEIGHTS = np.array([241, 691, 68], dtype=np.int32)


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
MOMENTS = np.stack((np.ones(256), LEVELS, LEVELS * LEVELS))  # one matrix product gives count, sum and sum of squares


def moments(histogram) -> tuple[float, float]:
    """Mean and variance of a grey image from its 256-bin histogram (ImageStat's, without its Python loops)."""
    total, first, second = MOMENTS @ np.asarray(histogram, dtype=np.float64)  # integers: exact in any order
    mean = first / total
    # numpy scalars, whose round() the published signatures were rounded with (it differs from Python's at .5)
    return mean, max(0.0, second / total - mean * mean)


def thumbnail(image: Image.Image) -> Image.Image:
    """`image` shrunk to SIDE px on its longer side, or itself when it is no larger: what the scores (and the
    near-copy thumbnail, components/common/signatures.py) are taken from."""
    if max(image.size) <= SIDE:
        return image
    width, height = _thumbnail_size(image.size)
    return image.resize((width, height), Image.BILINEAR, reducing_gap=2.0)


def _thumbnail_size(size: tuple[int, int]) -> tuple[int, int]:
    ratio = SIDE / max(size)
    return max(1, round(size[0] * ratio)), max(1, round(size[1] * ratio))


def scores_of(image: Image.Image, grey: Image.Image, counts: np.ndarray | None = None,
              small: Image.Image | None = None) -> Scores:
    """The scores of `image` (RGB, as decoded) and its grey version: entropy from the grey image as
    decoded, the rest from a thumbnail of at most SIDE px (`small`, when the caller made it already).
    PIL's C code does the pixel loops, numpy the few thousand pixels of the thumbnail, each in one pass:
    no conversion is made twice."""
    counts = np.asarray(grey.histogram() if counts is None else counts, dtype=np.float64)
    shares = counts[counts > 0] / counts.sum()
    size, small = image.size, thumbnail(image) if small is None else small
    thumb = grey if small is image else small.convert("L")
    rgb = np.asarray(small if small.mode == "RGB" else small.convert("RGB"))
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    colour = int((np.maximum(np.maximum(r, g), b) - np.minimum(np.minimum(r, g), b)).max())
    values = rgb.reshape(-1, 3).astype(np.int32)
    square = (values * values) @ WEIGHTS  # brightness^2 x 1000
    k99, k5 = (min(square.size - 1, int(q * (square.size - 1))) for q in (0.99, 0.05))
    high, low = np.partition(square, (k5, k99))[[k99, k5]]
    levels = np.asarray(thumb.histogram(), dtype=np.float64)  # the spread: the std of its 256 counts,
    if max(size) < SIDE:  # as many as a thumbnail of a larger picture of this shape would count
        width, height = _thumbnail_size(size)
        levels *= width * height / (size[0] * size[1])
    return Scores(sharpness=round(moments(thumb.filter(ImageFilter.FIND_EDGES).histogram())[1], 2),
                  spread=round(math.sqrt(max(0.0, float(levels @ levels) / 256 - (float(levels.sum()) / 256) ** 2)), 2),
                  dark=round(math.sqrt(high / 1000) / 255, 4), light=round(math.sqrt(low / 1000) / 255, 4),
                  entropy=round(float(-(shares @ np.log2(shares))), 3), colour=colour)
