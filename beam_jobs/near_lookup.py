"""What each Beam worker holds to find a new image's near-copy among the published records: the rules,
and the staged dHashes in a banded index (beam_jobs/near_copies.py stages them and settles the rest).

Kept apart from the driver's side so an image worker loads numpy and the index, not the spans' layout and
result models (pydantic: 0.15 s of each worker's start).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import fsspec
import numpy as np

from components.common.near_index import BandedIndex
from components.contracts.schema import SPLITS


@dataclass(frozen=True)
class NearRules:
    mode: str = "report"  # follow, set_aside or report
    bits: int = 6
    min_side: int = 16
    eval_fraction: float = 0.1  # the eval share the path hash gives: following may not move it far unsaid

    @classmethod
    def of(cls, config) -> NearRules:
        return cls(config.near_copies, config.near_copy_bits, config.near_copy_min_side, config.eval_fraction)

    def eligible(self, width: int, height: int) -> bool:
        return min(width, height) >= self.min_side


def load_staged(uri: str) -> np.lib.npyio.NpzFile:
    with fsspec.open(uri, "rb") as f:
        return np.load(io.BytesIO(f.read()))


class Published:
    """The published records' dHashes in a banded index, as each Beam worker holds them (once a process)."""

    def __init__(self, uri: str, bits: int):
        arrays = load_staged(uri)
        self.splits = arrays["splits"]
        self.index = BandedIndex(arrays["hashes"], bits)

    def match(self, dhash: str, mirror: str) -> dict | None:
        """The nearest published record to the picture or its mirror image: row, split, distance, mirrored."""
        best = None
        for value, mirrored in ((dhash, False), (mirror, True)):
            found = self.index.nearest(int(value, 16))
            if found and (best is None or found[1] < best[1]):
                best = (*found, mirrored)
        if best is None:
            return None
        row, apart, mirrored = best
        return {"row": row, "split": SPLITS[int(self.splits[row])], "distance": apart, "mirrored": mirrored}
