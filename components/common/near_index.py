"""Which 64-bit dHashes lie within a few bits of a given one, without comparing it with them all.

Multi-index hashing (Norouzi, Punjani and Fleet, "Fast Search in Hamming Space with Multi-Index
Hashing", CVPR 2012): the 64 bits are cut into `bits + 1` bands. Two hashes at most `bits` apart differ
in at most `bits` bands, so they agree exactly on at least one (pigeonhole). Each band is kept as a
sorted array of its values beside the rows holding them; a query finds its band values by binary
search, and only the rows found there get their whole distance counted. Memory is 8 bytes a record
for the hashes plus 6 a record a band (a 16-bit value and a row): 50 bytes a record at 6 bits.

Pictures alike at 9x8 (a fixed camera's frames) share whole hashes, so their band values would hand
each lookup thousands of rows. A band value held by more rows than `hot` (and 8 times the band's
average) is left out of its band, as a text index leaves out its stop words (Sivic and Zisserman,
"Video Google", ICCV 2003, drop the most frequent visual words): a lookup then counts at most that many
rows a band, however alike the hashes, and still finds a hash through any other band it shares.
"""
from __future__ import annotations

import numpy as np


def bands(bits: int) -> list[tuple[int, int]]:
    """(shift, width) of each of the `bits + 1` bands, as even as 64 bits allow."""
    count = bits + 1
    widths = [64 // count + (1 if i < 64 % count else 0) for i in range(count)]
    return [(sum(widths[:i]), width) for i, width in enumerate(widths)]


class BandedIndex:
    """The rows of `hashes` within `bits` of a query; rows whose `usable` is False are never found, nor
    (with `hot`) those found only through a hot band value."""

    def __init__(self, hashes: np.ndarray, bits: int, usable: np.ndarray | None = None, hot: int | None = None):
        self.hashes, self.bits = np.asarray(hashes, dtype=np.uint64), bits
        rows = np.arange(len(self.hashes), dtype=np.int64)
        if usable is not None:
            rows = rows[np.asarray(usable, dtype=bool)]
        self.bands, self.hot = [], []
        for shift, width in bands(bits):
            kind = np.uint16 if width <= 16 else np.uint32 if width <= 32 else np.uint64
            values = ((self.hashes[rows] >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(kind)
            order = np.argsort(values, kind="stable")
            values, band_rows = values[order], rows[order].astype(np.int32)
            common = set()
            if hot is not None and len(values):
                distinct, counts = np.unique(values, return_counts=True)
                over = counts > max(hot, 8 * len(values) / 2.0 ** width)
                common = set(distinct[over].tolist())
                keep = np.repeat(~over, counts)
                values, band_rows = values[keep], band_rows[keep]
            self.bands.append((shift, width, values, band_rows))
            self.hot.append(common)

    def all_hot(self, value: int) -> bool:
        """Whether every band value of `value` is hot: the index cannot find what lies near it."""
        return bool(self.bands) and all((value >> shift) & ((1 << width) - 1) in common
                                        for (shift, width, _, _), common in zip(self.bands, self.hot))

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

    @property
    def nbytes(self) -> int:
        return self.hashes.nbytes + sum(values.nbytes + rows.nbytes for _, _, values, rows in self.bands)
