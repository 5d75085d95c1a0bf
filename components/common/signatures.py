"""What a record's content is, small enough to group, sort and count without its bytes.

Computed in ingest's Beam job from what it already holds: the source file's bytes (SHA-256: a
re-upload under another name shares it) and the image ingest decoded to verify it (a 64-bit
difference hash of the picture and of its mirror image, the grey level's mean and spread, and the
quality scores of components/common/quality_scores.py). The driver decides duplicates, writes the span's
content index and statistics from these alone (beam_jobs/duplicates.py, statistics.py); a damaged
content index is computed again from the span's records the same way
(components/common/trusted_index.py), which is why this lives below both.

The difference hash is Krawetz's dHash ("Kind of Like That", 2013): the grey picture shrunk to 9x8,
one bit per pair of horizontal neighbours (is the left one brighter?). Shrinking drops what a
re-encode, a resize or a light crop changes, so such copies stay within a few bits. A mirror image
reverses every row: its hash comes from the same thumbnail read right to left, so a mirrored copy
is found by looking up the mirror's hash (beam_jobs/near_copies.py).

Where many pictures are alike at 9x8 (a fixed camera, scans, products on white) dHash cannot tell them
apart, so near_copies.py compares those by a finer signature: the picture's mean colour in each block of
an 8x8 grid, 192 bytes (a pixel comparison at a small common size, as PSNR measures a re-encode). It is
taken from the 64 px thumbnail the quality scores use, at one small resize (13 µs, 4% of this module's
time), and kept only in the staged signatures: published content indexes hold what they always held.
Stored, not decoded again for the crowds alone: most of an arrival of smooth or centred pictures lies
in crowds, and a second decode costs some 20 times as much.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from components.common.quality_scores import Scores, moments, scores_of, thumbnail

HASH_SIDE = 8  # dHash: an 8x9 grey thumbnail, one bit per pair of horizontal neighbours
BLOCKS = 8  # the finer signature: mean colours of an 8x8 grid of blocks


@dataclass(frozen=True)
class Pixels:
    dhash: str  # 16 hex digits
    mean: float  # grey level, 0-255
    std: float
    mirror: str = ""  # dHash of the picture mirrored left to right
    quality: Scores | None = None
    blocks: bytes = b""  # mean R, G, B of each block of an 8x8 grid, row by row


def pixels_of(image: Image.Image) -> Pixels:
    """dHashes, grey mean and std, quality scores and block colours of `image` as decoded (a JPEG may be at a DCT
    scale: the same picture, smaller), from one grey conversion and one histogram of it."""
    grey = image.convert("L")
    histogram = np.asarray(grey.histogram(), dtype=np.float64)
    mean, variance = moments(histogram)
    dhash, mirror = hashes(np.asarray(grey.resize((HASH_SIDE + 1, HASH_SIDE), Image.BILINEAR)))
    small = thumbnail(image)
    return Pixels(dhash, round(mean, 3), round(math.sqrt(variance), 3), mirror,
                  scores_of(image, grey, histogram, small), blocks(small))


def blocks(image: Image.Image) -> bytes:
    """The mean colour of each block of a BLOCKS x BLOCKS grid over `image` (PIL's box filter: of the pixels
    whose centre lies in the block), as R, G, B bytes row by row."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return rgb.resize((BLOCKS, BLOCKS), Image.BOX).tobytes()


def hashes(thumb: np.ndarray) -> tuple[str, str]:
    """The dHash of a 9x8 grey thumbnail and of its mirror image, as 16 hex digits each: bit 63 is the
    top-left pair. The mirror's pairs are the thumbnail's, compared the other way and read right to left."""
    left, right = thumb[:, :-1], thumb[:, 1:]
    digits = np.packbits(np.stack((left > right, (right > left)[:, ::-1])).reshape(2, -1), axis=1).tobytes().hex()
    return digits[:16], digits[16:]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def distance(a: str, b: str) -> int:
    """Hamming distance of two dHashes: 0-4 is the same picture re-encoded, resized or lightly cropped."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
