"""The banded dHash index finds exactly what comparing with every hash finds, for any distance."""
import numpy as np
import pytest

from components.common.near_index import BandedIndex, bands


@pytest.mark.parametrize("bits", [0, 1, 4, 6, 10])
def test_the_banded_lookup_finds_what_brute_force_finds(bits):
    rng = np.random.default_rng(bits)
    hashes = rng.integers(0, 2**63, 2000, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 2000, dtype=np.uint64)
    flips = rng.integers(0, 64, (200, bits + 2))  # near each of 200 hashes: up to bits + 2 bits flipped
    queries = [int(hashes[i]) ^ sum(1 << b for b in {int(b) for b in flips[i][: i % (bits + 3)]}) for i in range(200)]
    usable = rng.random(2000) > 0.1
    index = BandedIndex(hashes, bits, usable)
    for value in queries:
        apart = np.bitwise_count(hashes ^ np.uint64(value))
        expected = np.flatnonzero((apart <= bits) & usable)
        rows, distances = index.within(value)
        assert rows.tolist() == expected.tolist() and distances.tolist() == apart[expected].tolist()
        nearest = index.nearest(value)
        assert nearest == (None if not len(expected) else (int(expected[np.argmin(apart[expected])]), int(apart[expected].min())))
    assert sum(width for _, width in bands(bits)) == 64 and len(bands(bits)) == bits + 1


@pytest.mark.parametrize("bits, budget", [(0, 1 << 21), (3, 50), (6, 1 << 21), (6, 1), (10, 500)])
def test_all_pairs_at_once_are_what_each_lookup_finds_nearest_first(bits, budget):
    """Clustered hashes (many share bands, as a set of alike pictures does), queries near them and far,
    in chunks down to one query at a time."""
    rng = np.random.default_rng(bits)
    centres = rng.integers(0, 2**63, 40, dtype=np.uint64) * np.uint64(2)
    flips = [sum(1 << int(b) for b in rng.choice(64, int(rng.integers(0, bits + 3)), replace=False)) for _ in range(1500)]
    hashes = np.array([int(centres[i % 40]) ^ f for i, f in enumerate(flips)], dtype=np.uint64)
    queries = np.concatenate([hashes[:300], rng.integers(0, 2**63, 100, dtype=np.uint64)])
    usable = rng.random(1500) > 0.1
    index = BandedIndex(hashes, bits, usable)
    found = index.pairs(queries, budget)
    for q, value in enumerate(queries.tolist()):
        rows, distances = index.within(value)
        order = np.lexsort((rows, distances))
        assert list(found.of(q)) == list(zip(rows[order].tolist(), distances[order].tolist()))
    assert list(BandedIndex(hashes[:0], bits).pairs(queries[:3]).of(2)) == []
    assert index.pairs(queries[:0]).offsets == [0]
    before = rng.integers(0, 1600, len(queries))  # each query's own bound: none, all and rows between
    bounded = index.pairs(queries, budget, before)
    for q in range(len(queries)):
        assert list(bounded.of(q)) == [(row, apart) for row, apart in found.of(q) if row < before[q]]
