"""The banded dHash index finds exactly what comparing with every hash finds, for any distance; hot band
values (a crowd of equal hashes) are left out of their band."""
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
    assert sum(width for _, width in bands(bits)) == 64 and len(bands(bits)) == bits + 1


def test_hot_band_values_are_left_out_and_a_hash_is_still_found_through_another_band():
    """A crowd of 3,000 equal hashes makes every one of its band values hot: a lookup no longer hands out its
    rows (at most `hot` a band), says the crowd is there, and still finds a hash that shares a cold band."""
    rng = np.random.default_rng(0)
    crowd = np.full(3000, 0x0123_4567_89AB_CDEF, dtype=np.uint64)
    others = rng.integers(0, 2**63, 500, dtype=np.uint64)
    near = np.uint64(int(crowd[0]) ^ 0b111)  # 3 bits from the crowd: its first band differs, the others are hot
    hashes = np.concatenate([crowd, others, [near]])
    index = BandedIndex(hashes, 6, hot=100)
    assert all(len(rows) <= 501 for _, _, _, rows in index.bands)  # the crowd's rows are gone from every band
    assert index.all_hot(int(crowd[0])) and not index.all_hot(int(others[0]))
    assert len(index.within(int(crowd[0]))[0]) == 0
    rows, distances = index.within(int(near) ^ (1 << 20))  # shares the first band (cold) with `near` only
    assert rows.tolist() == [len(hashes) - 1] and distances.tolist() == [1]
    assert index.within(int(others[7]))[0].tolist() == [3007]
    unbounded = BandedIndex(hashes, 6)
    assert len(unbounded.within(int(crowd[0]))[0]) == 3001 and not unbounded.all_hot(int(crowd[0]))
