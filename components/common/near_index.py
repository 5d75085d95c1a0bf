"""Which 64-bit dHashes lie within a few bits of a given one, without comparing it with them all.

Multi-index hashing (Norouzi, Punjani and Fleet, "Fast Search in Hamming Space with Multi-Index
Hashing", CVPR 2012): the 64 bits are cut into `bits + 1` bands. Two hashes at most `bits` apart differ
in at most `bits` bands, so they agree exactly on at least one (pigeonhole). Each band is kept as a
sorted array of its values beside the rows holding them; a query finds its band values by binary
search, and only the rows found there get their whole distance counted. Memory is 8 bytes a record
for the hashes plus 6 a record a band (a 16-bit value and a row): 50 bytes a record at 6 bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Pairs:
    """Query q's rows within the bits are rows[offsets[q]:offsets[q + 1]], nearest first, then by row;
    their distances are beside them in `distances`."""

    offsets: list[int]
    rows: list[int]
    distances: list[int]

    def of(self, query: int):
        start, end = self.offsets[query], self.offsets[query + 1]
        return zip(self.rows[start:end], self.distances[start:end])


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

    def pairs(self, values: np.ndarray, budget: int = 1 << 21, before: np.ndarray | None = None) -> Pairs:
        """Every usable row within `bits` of each of `values` (uint64): what `within` finds, for all the
        queries in a few vectorised passes; with `before`, only the rows below before[q] for query q (those
        that came earlier). Queries are taken in chunks of about `budget` band matches, so memory stays
        bounded however alike they are."""
        values = np.asarray(values, dtype=np.uint64)
        if not len(values) or not self.bands:
            return Pairs([0] * (len(values) + 1), [], [])
        spans = [(np.searchsorted(keys, wanted, "left"), np.searchsorted(keys, wanted, "right"))
                 for keys, wanted in ((band[2], self._band_of(values, band)) for band in self.bands)]
        matches = np.cumsum(sum(high - low for low, high in spans))
        chunks, start = [], 0
        while start < len(values):
            end = max(start + 1, int(np.searchsorted(matches, (matches[start - 1] if start else 0) + budget, "right")))
            chunks.append(self._chunk(values, before, spans, start, min(end, len(values))))
            start = end
        query, row, apart = (np.concatenate(parts) for parts in zip(*chunks))
        offsets = np.searchsorted(query, np.arange(len(values) + 1))
        return Pairs(offsets.tolist(), row.tolist(), apart.tolist())

    def _band_of(self, values: np.ndarray, band) -> np.ndarray:
        shift, width, keys, _ = band
        return ((values >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(keys.dtype)

    def _chunk(self, values, before, spans, start: int, end: int):
        """(query, row, distance) of queries start..end-1, once each across bands, by query, distance, row."""
        queries, rows = [], []
        for (low, high), (_, _, _, band_rows) in zip(spans, self.bands):
            low, high = low[start:end], high[start:end]
            counts = high - low
            queries.append(np.repeat(np.arange(start, end), counts))
            offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            rows.append(band_rows[np.repeat(low, counts) + offsets].astype(np.int64))
        query, row = np.concatenate(queries), np.concatenate(rows)
        apart = np.bitwise_count(self.hashes[row] ^ values[query]).astype(np.int64)
        keep = apart <= self.bits  # most band matches are farther: drop them before sorting
        if before is not None:
            keep &= row < before[query]
        # One int64 key sorts by query, distance, row; a pair found in several bands repeats its key.
        width = len(self.hashes) + 1
        key = np.sort((query[keep] * (self.bits + 1) + apart[keep]) * width + row[keep])
        key = key[np.diff(key, prepend=-1) != 0]
        rest, row = np.divmod(key, width)
        query, apart = np.divmod(rest, self.bits + 1)
        return query, row, apart

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
