import hashlib
import os
import zlib

import pytest
import tensorflow as tf

from beam_jobs.shards import RecordFile, RollingShards, StagedFileChanged, prune, rearrange
from components.contracts.layout import TF_COMPRESSION


@pytest.mark.parametrize("compression", ["gzip", "zlib", "none"])
def test_tensorflow_reads_what_the_writer_frames(tmp_path, compression):
    records = [b"", b"a", bytes(range(256)) * 100]
    writer = RecordFile(str(tmp_path / "f"), compression)
    for record in records:
        writer.write(record)
    described = writer.close()
    assert described["records"] == 3 and described["bytes"] == (tmp_path / "f").stat().st_size
    assert described["sha256"] == hashlib.sha256((tmp_path / "f").read_bytes()).hexdigest()  # of the whole file
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "f"), TF_COMPRESSION[compression])]
    assert read == records


def test_rolling_shards_bound_each_file(tmp_path):
    shards = RollingShards(str(tmp_path), max_bytes=1000, compression="gzip")
    closed = [shards.write("train", b"x" * 400) for _ in range(7)] + [shards.write("eval", b"y")]
    closed = [c for c in closed if c] + shards.close()
    assert sorted((c["split"], c["records"]) for c in closed) == [
        ("eval", 1), ("train", 1), ("train", 3), ("train", 3)]
    total = sum(sum(1 for _ in tf.data.TFRecordDataset(c["file"], "GZIP")) for c in closed)
    assert total == 8


def test_a_pruned_shard_records_the_digest_of_its_new_bytes(tmp_path):
    shards = RollingShards(str(tmp_path), max_bytes=10**6, compression="gzip")
    for index in range(4):
        shards.write("train", b"record %d" % index)
    [staged] = shards.close()
    [kept] = prune([staged], [{"file": staged["file"], "index": 1}], "gzip")
    data = open(kept["file"], "rb").read()
    assert kept["records"] == 3 and (kept["bytes"], kept["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert kept["sha256"] != staged["sha256"]


def _records(shard: dict, compression: str) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(shard["file"], TF_COMPRESSION[compression])]


def _staged(folder, compression: str, count: int = 6) -> dict:
    shards = RollingShards(str(folder), max_bytes=10**6, compression=compression)
    for index in range(count):
        shards.write("train", b"record %d " % index * 40)
    [staged] = shards.close()
    return staged


@pytest.mark.parametrize("compression", ["gzip", "zlib", "none"])
def test_rearranged_records_keep_their_bytes_in_their_new_split(tmp_path, compression):
    staged = _staged(tmp_path, compression)
    moved = [{"file": staged["file"], "index": 2, "split": "eval"}, {"file": staged["file"], "index": 5, "split": "eval"}]
    out = rearrange([staged], [{"file": staged["file"], "index": 4}], moved, compression, str(tmp_path), 10**6)
    read = {shard["split"]: _records(shard, compression) for shard in out}
    assert read == {"train": [b"record %d " % i * 40 for i in (0, 1, 3)], "eval": [b"record %d " % i * 40 for i in (2, 5)]}
    for shard in out:
        data = open(shard["file"], "rb").read()
        assert (shard["bytes"], shard["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert not os.path.exists(staged["file"])


def test_a_gzip_shard_is_one_member_per_record(tmp_path):
    """So a record moves between files as its bytes: each member inflates alone to one frame."""
    staged = _staged(tmp_path, "gzip", count=3)
    data = open(staged["file"], "rb").read()
    rest, frames, starts = data, [], []
    while rest:
        starts.append(len(data) - len(rest))
        member = zlib.decompressobj(16 + 15)
        frames.append(member.decompress(rest))
        rest = member.unused_data
    assert [f[12:-4] for f in frames] == [b"record %d " % i * 40 for i in range(3)]
    assert staged["starts"] == starts


@pytest.mark.parametrize("tamper", ["flip a byte", "truncate", "append", "swap for another shard"])
def test_a_staged_file_that_changed_since_it_was_written_is_not_copied(tmp_path, tamper):
    staged, other = _staged(tmp_path / "a", "gzip"), _staged(tmp_path / "b", "gzip", count=5)
    data = bytearray(open(staged["file"], "rb").read())
    changed = {"flip a byte": lambda: data[:40] + bytes([data[40] ^ 1]) + data[41:], "truncate": lambda: data[:-1],
               "append": lambda: data + data[:20], "swap for another shard": lambda: open(other["file"], "rb").read()}
    open(staged["file"], "wb").write(bytes(changed[tamper]()))
    with pytest.raises(StagedFileChanged, match="changed after it was written"):
        rearrange([staged], [{"file": staged["file"], "index": 0}], [], "gzip", str(tmp_path), 10**6)


def test_many_shards_settle_on_threads_into_the_same_records(tmp_path):
    """More touched shards than threads: untouched, one emptied, one moving away whole, mixed; the moving
    records roll over into several files in shard order and every original that was touched is gone."""
    staged = [_staged(tmp_path / str(n), "gzip", count=6) for n in range(7)]
    files = [shard["file"] for shard in staged]
    dropped = [{"file": files[1], "index": i} for i in range(6)] + [{"file": files[3], "index": 0},
                                                                     {"file": files[5], "index": 5}]
    moved = [{"file": files[2], "index": i, "split": "eval"} for i in range(6)] + [
        {"file": files[3], "index": 4, "split": "eval"}, {"file": files[6], "index": 1, "split": "test"}]
    out = rearrange(staged, dropped, moved, "gzip", str(tmp_path), 400)
    read = {}
    for shard in out:
        read.setdefault(shard["split"], []).extend(_records(shard, "gzip"))
    record = [b"record %d " % i * 40 for i in range(6)]
    assert sorted(read["train"]) == sorted(record * 2 + record[1:4] + record[5:] + record[:5] + record[:1] + record[2:])
    assert read["eval"] == record + record[4:5] and read["test"] == record[1:2]  # in shard order
    assert len([shard for shard in out if shard["split"] == "eval"]) > 1  # rolled over at 400 bytes
    assert staged[0] in out and staged[4] in out  # left alone
    assert [os.path.exists(f) for f in files] == [True, False, False, False, True, False, False]
