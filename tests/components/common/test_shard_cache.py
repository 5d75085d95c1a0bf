"""The shard cache on its own: what it copies, what it keeps, what it evicts, and which shards a worker stages."""
from __future__ import annotations

import os

import pytest

from components.common import tf_files
from components.common.shard_cache import CacheError, ShardCache, shards_of_worker
from components.contracts.layout import Root
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache-source"))
    write_span(root, 1, {"train": tiny_records(24)}, TRAIN_LABELS, {"train": 3})
    return Root(root).shards("train")


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
    with pytest.raises(CacheError, match="--shard-cache-max-gb"):
        cache.stage(shards)  # all three never fit


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
    data = bytearray(open(shards[0].uri, "rb").read())
    data[len(data) // 2] ^= 0xFF
    source.write_bytes(bytes(data))
    shard = type(shards[0])(str(source), shards[0].compression, shards[0].records, 1, len(data))
    cache = ShardCache(str(tmp_path / "cache"), max_gb=1)
    staged = cache.stage([shard])
    assert staged.corrupt == [str(source)]
    assert os.path.exists(cache.path(shard)) and not os.path.exists(cache.path(shard) + ".verified")
    assert cache.stage([shard]).fetched == 1  # never trusted: the next run fetches it again


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
