"""The shard cache on its own: what it copies, what it keeps, what it evicts, and which shards a worker stages."""
from __future__ import annotations

import dataclasses
import json
import os

import google_crc32c
import pytest

from components.common import tf_files
from components.common.shard_cache import CacheError, ShardCache, shards_of_worker
from components.common.spans import Spans
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span
from tests.hints import assert_runnable


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache-source"))
    write_span(root, 1, {"train": tiny_records(24)}, TRAIN_LABELS, {"train": 3})
    return Spans(root).shards("train")


def test_the_least_recently_used_copies_are_evicted_under_the_cap(shards, tmp_path):
    a, b, c = shards
    cache = ShardCache(str(tmp_path), max_gb=(a.bytes + b.bytes + c.bytes - 1) / 1e9)  # two of three fit
    assert cache.needs(shards) == a.bytes + b.bytes + c.bytes
    assert cache.stage([a]).fetched == 1 and cache.stage([b]).fetched == 1
    os.utime(cache.path(a) + ".verified", (0, 0))
    os.utime(cache.path(b) + ".verified", (1, 1))
    assert cache.stage([a]).reused == 1  # a is used again: b is now the one used longest ago
    staged = cache.stage([c])
    assert staged.fetched == 1 and staged.to_json()["mb_per_sec"] > 0
    assert os.path.exists(cache.path(a)) and not os.path.exists(cache.path(b)) and os.path.exists(cache.path(c))
    assert cache.needs(shards) == b.bytes
    with pytest.raises(CacheError, match="--shard-cache-max-gb") as refused:
        cache.stage(shards)  # all three never fit
    assert_runnable(str(refused.value))


def test_copies_are_reused_and_a_copy_damaged_in_place_is_fetched_again(shards, tmp_path):
    cache = ShardCache(str(tmp_path), max_gb=1)
    assert cache.stage(shards).fetched == len(shards)
    assert (cache.stage(shards).fetched, cache.stage(shards).reused) == (0, len(shards))
    damaged = cache.path(shards[0])
    with open(damaged, "r+b") as f:  # one byte flipped: the size still matches
        f.seek(os.path.getsize(damaged) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    staged = cache.stage(shards)
    assert (staged.fetched, staged.reused, len(staged.refetched)) == (1, len(shards) - 1, 1)


def test_a_shard_corrupt_at_its_source_is_left_unverified_and_named(shards, tmp_path):
    source = tmp_path / "source.tfrecord.gz"
    source.write_bytes(_flipped(open(shards[0].uri, "rb").read()))
    shard = dataclasses.replace(shards[0], uri=str(source))  # the manifest's size and digest, other bytes
    cache = ShardCache(str(tmp_path / "cache"), max_gb=1)
    staged = cache.stage([shard])
    assert staged.corrupt == [str(source)]
    assert os.path.exists(cache.path(shard)) and not os.path.exists(cache.path(shard) + ".verified")
    assert cache.stage([shard]).fetched == 1  # never trusted: the next run fetches it again


def _flipped(data: bytes) -> bytes:
    """The same number of bytes, one of them different: a forged or rotten copy that keeps its size."""
    data = bytearray(data)
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


def _forge(cache, shard, marker: dict | None) -> None:
    """Puts a same-size copy with other bytes where the cache keeps `shard`, and `marker` beside it."""
    local = cache.path(shard)
    with open(local, "wb") as f:
        f.write(_flipped(open(shard.uri, "rb").read()))
    if marker is not None:
        with open(local + ".verified", "w") as f:
            json.dump(marker, f)


def _crc32c(path) -> str:
    return google_crc32c.Checksum(open(path, "rb").read()).hexdigest().decode()


@pytest.mark.parametrize("marker", ["its own size and CRC32C", "the manifest's digest", "none"])
def test_a_forged_copy_is_never_reused_whatever_its_marker_says(shards, tmp_path, marker):
    cache = ShardCache(str(tmp_path), max_gb=1)
    cache.stage(shards)
    shard = shards[0]
    local = cache.path(shard)
    claims = {"its own size and CRC32C": lambda: {"bytes": shard.bytes, "crc32c": _crc32c(local)},
              "the manifest's digest": lambda: {"bytes": shard.bytes, "sha256": shard.sha256}, "none": lambda: None}
    _forge(cache, shard, None)
    _forge(cache, shard, claims[marker]())
    staged = cache.stage(shards)
    assert (staged.fetched, staged.reused) == (1, len(shards) - 1)
    assert open(local, "rb").read() == open(shard.uri, "rb").read()


def test_a_shard_without_a_digest_in_its_manifest_is_not_cached(shards, tmp_path):
    with pytest.raises(CacheError, match="no size and SHA-256"):
        ShardCache(str(tmp_path), max_gb=1).stage([dataclasses.replace(shards[0], sha256=None)])
    with pytest.raises(CacheError, match="no plain path"):  # a name that is no file name in its span folder
        ShardCache(str(tmp_path), max_gb=1).stage([dataclasses.replace(shards[0], uri=shards[0].uri + "/..")])


def test_links_planted_in_the_cache_are_never_followed(shards, tmp_path):
    """A link in place of a copy (to a good copy elsewhere), of its marker, or at the name a partial copy
    once took: each is replaced or removed, and nothing outside the cache changes."""
    a, b, _ = shards
    cache, outside = ShardCache(str(tmp_path / "cache"), max_gb=1), tmp_path / "outside"
    cache.stage([a])
    outside.mkdir()
    for name in ("copy", "marker", "victim"):
        (outside / name).write_bytes(open(a.uri, "rb").read() if name == "copy" else b"untouched")
    local = cache.path(a)
    os.remove(local)
    os.symlink(outside / "copy", local)  # the right bytes, the right marker beside it: still not a copy of ours
    os.symlink(outside / "marker", cache.path(b) + ".verified")
    os.symlink(outside / "victim", f"{cache.path(b)}.part-{os.getpid()}")  # the name a copy once took
    staged = cache.stage(shards)
    assert staged.refetched == [a.uri] and staged.fetched == 3
    for shard in shards:
        assert not os.path.islink(cache.path(shard)) and not os.path.islink(cache.path(shard) + ".verified")
        assert open(cache.path(shard), "rb").read() == open(shard.uri, "rb").read()
    assert not os.path.lexists(f"{cache.path(b)}.part-{os.getpid()}")
    assert sorted(os.listdir(outside)) == ["copy", "marker", "victim"]
    assert (outside / "marker").read_bytes() == b"untouched" and (outside / "victim").read_bytes() == b"untouched"


def test_a_link_in_place_of_a_span_folder_is_replaced(shards, tmp_path):
    cache, outside = ShardCache(str(tmp_path / "cache"), max_gb=1), tmp_path / "outside"
    outside.mkdir()
    span = os.path.dirname(cache.path(shards[0]))
    os.makedirs(os.path.dirname(span))
    os.symlink(outside, span)
    assert cache.stage(shards).fetched == len(shards)
    assert not os.path.islink(span) and not os.listdir(outside)


def test_a_worker_stages_the_files_its_input_pipeline_reads(shards):
    files = [*shards, *shards]  # six files
    assert shards_of_worker(files, 2, 1, by_file=True) == files[1::2]
    assert shards_of_worker(files, 2, 1, by_file=False) == files
    assert shards_of_worker(files, 1, 0, by_file=True) == files


def test_an_upload_puts_the_marking_file_last_and_prunes_after(tmp_path, monkeypatch):
    local, remote = tmp_path / "local", tmp_path / "remote"
    for name in ("saved_model.pb", "variables/variables.index", "assets/z.txt"):
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text(name)
    (remote / "stale").mkdir(parents=True)
    (remote / "stale" / "old").write_text("old")
    fs, _ = tf_files.filesystem(str(remote))
    order = []
    real = fs.put_file
    monkeypatch.setattr(fs, "put_file", lambda src, dst, **kw: (order.append(os.path.basename(dst)), real(src, dst, **kw)))
    tf_files.push(str(local), str(remote), last="saved_model.pb", prune=True)
    assert order[-1] == "saved_model.pb" and len(order) == 3
    assert not (remote / "stale" / "old").exists()
