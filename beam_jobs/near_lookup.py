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

# More near-copies of one picture than this are no re-uploads of it (a picture comes back re-encoded, resized,
# cropped, turned or mirrored: a handful of forms) but pictures dHash's 9x8 thumbnail cannot tell apart: a
# fixed camera's frames, scans, products on white. beam_jobs/near_copies.py judges such a crowd by block colours.
CROWD = 8
HOT = 1024  # published rows a band value may hand a lookup (components/common/near_index.py: stop words)


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
        self.index = BandedIndex(arrays["hashes"], bits, hot=HOT)

    def match(self, dhash: str, mirror: str) -> dict | None:
        """The nearest published record to the picture or its mirror image (the picture's unless the mirror's
        is nearer, the lowest row of equals): row, split, distance, mirrored. None when there is none; and
        {"crowded": True} when dHash cannot name one: more than CROWD are as near, or the picture's every band
        value is shared by a crowd. Published records keep no block colours, so such an image keeps its split."""
        picture = int(dhash, 16)
        (rows, apart), (flipped, flipped_apart) = self.index.within(picture), self.index.within(int(mirror, 16))
        if not len(rows) and not len(flipped):
            return {"crowded": True} if self.index.all_hot(picture) else None
        near = int(min(apart.min(initial=65), flipped_apart.min(initial=65)))
        if len(np.union1d(rows[apart == near], flipped[flipped_apart == near])) > CROWD:
            return {"crowded": True}
        mirrored = not len(rows) or apart.min() > near
        row = flipped[np.argmax(flipped_apart == near)] if mirrored else rows[np.argmax(apart == near)]  # rows ascend
        return {"row": int(row), "split": SPLITS[int(self.splits[row])], "distance": near, "mirrored": bool(mirrored)}
