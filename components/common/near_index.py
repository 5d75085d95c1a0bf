"""Which 64-bit dHashes lie within a few bits of a given one, without comparing it with them all.

Multi-index hashing (Norouzi, Punjani and Fleet, "Fast Search in Hamming Space with Multi-Index
Hashing", CVPR 2012): the 64 bits are cut into `bits + 1` bands. Two hashes at most `bits` apart differ
in at most `bits` bands, so they agree exactly on at least one (pigeonhole). Each band is kept as a
sorted array of its values beside the rows holding them; a query finds its band values by binary
search, and only the rows found there get their whole distance counted. Memory is 8 bytes a record
for the hashes plus 6 a record a band (a 16-bit value and a row): 50 bytes a record at 6 bits.
"""
from __future__ import annotations

import numpy as np


def bands(bits: int) -> list[tuple[int, int]]:
    """(shift, width) of each of the `bits + 1` bands, as even as 64 bits allow."""
    count = bits + 1
    widths = [64 // count + (1 if i < 64 % count else 0) for i in range(count)]
    return [(sum(widths[:i]), width) for i, width in enumerate(widths)]


def as_numbers(hashes: list[str]) -> np.ndarray:
    return np.array([int(h, 16) for h in hashes], dtype=np.uint64)


class BandedIndex:
    """The rows of `hashes` within `bits` of a query; rows whose `usable` is False are never found."""

    def __init__(self, hashes: np.ndarray, bits: int, usable: np.ndarray | None = None):
        self.hashes, self.bits = np.asarray(hashes, dtype=np.uint64), bits
        rows = np.arange(len(self.hashes), dtype=np.int64)
        if usable is not None:
            rows = rows[np.asarray(usable, dtype=bool)]
        self.usable = np.zeros(len(self.hashes) + 1, dtype=bool)  # [row]: found by queries; [-1], no row: False
        self.usable[rows] = True
        self.bands = []
        for shift, width in bands(bits):
            kind = np.uint16 if width <= 16 else np.uint32 if width <= 32 else np.uint64
            values = ((self.hashes[rows] >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(kind)
            order = np.argsort(values, kind="stable")
            self.bands.append((shift, width, values[order], rows[order].astype(np.int32)))

    def within(self, value: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, distances) of every usable hash within `bits` of `value`, rows ascending."""
        found = []
        for shift, width, values, rows in self.bands:
            key = values.dtype.type((value >> shift) & ((1 << width) - 1))
            low, high = np.searchsorted(values, key, "left"), np.searchsorted(values, key, "right")
            found.append(rows[low:high])
        candidates = np.unique(np.concatenate(found)) if found else np.array([], np.int32)
        apart = np.bitwise_count(self.hashes[candidates] ^ np.uint64(value)).astype(np.int64)
        keep = apart <= self.bits
        return candidates[keep], apart[keep]

    def may_match(self, values: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        """For each of `values` (uint64), whether a usable row other than `own` (its own row, or -1) agrees
        with it on a band: a value for which this is False has no row within `bits` but perhaps its own
        (the pigeonhole above), so `within` need not be asked. One vectorised pass over the bands."""
        values = np.asarray(values, dtype=np.uint64)
        own = np.full(len(values), -1, np.int64) if own is None else np.asarray(own, dtype=np.int64)
        found = np.zeros(len(values), dtype=bool)
        if not len(self.hashes):
            return found
        for shift, width, keys, _ in self.bands:
            wanted = ((values >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(keys.dtype)
            count = np.searchsorted(keys, wanted, "right") - np.searchsorted(keys, wanted, "left")
            # Its own row is among them when it is usable and agrees with the value on this band.
            theirs = (self.hashes[np.maximum(own, 0)] >> np.uint64(shift)) & np.uint64((1 << width) - 1)
            itself = self.usable[own] & (theirs.astype(keys.dtype) == wanted)
            found |= count > itself
        return found

    def nearest(self, value: int) -> tuple[int, int] | None:
        """(row, distance) of the nearest usable hash within `bits` (the lowest row of equals), or None."""
        rows, apart = self.within(value)
        if not len(rows):
            return None
        best = int(np.argmin(apart))  # argmin takes the first: rows are ascending
        return int(rows[best]), int(apart[best])

    @property
    def nbytes(self) -> int:
        return self.hashes.nbytes + sum(values.nbytes + rows.nbytes for _, _, values, rows in self.bands)
