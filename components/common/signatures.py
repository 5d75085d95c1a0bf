"""What a record's content is, small enough to group, sort and count without its bytes.

Computed in ingest's Beam job from what it already holds: the source file's bytes (SHA-256: a
re-upload under another name shares it) and the image ingest decoded to verify it (a 64-bit
difference hash and the grey level's mean and spread). The driver decides duplicates, writes the
span's content index and statistics from these alone (beam_jobs/duplicates.py, statistics.py); a
damaged content index is computed again from the span's records the same way
(components/common/trusted_index.py), which is why this lives below both.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from PIL import Image

HASH_SIDE = 8  # dHash: an 8x9 grey thumbnail, one bit per pair of horizontal neighbours


@dataclass(frozen=True)
class Pixels:
    dhash: str  # 16 hex digits
    mean: float  # grey level, 0-255
    std: float


def pixels_of(image: Image.Image) -> Pixels:
    """dHash, mean and std of `image` as decoded (a JPEG may be at a DCT scale: the same picture)."""
    grey = image.convert("L")
    values = np.asarray(grey, dtype=np.float32)
    thumb = np.asarray(grey.resize((HASH_SIDE + 1, HASH_SIDE), Image.BILINEAR), dtype=np.int16)
    bits = (thumb[:, :-1] > thumb[:, 1:]).flatten()
    number = int("".join("1" if b else "0" for b in bits), 2)
    return Pixels(f"{number:016x}", round(float(values.mean()), 3), round(float(values.std()), 3))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def distance(a: str, b: str) -> int:
    """Hamming distance of two dHashes: 0-4 is the same picture re-encoded, resized or retouched."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
