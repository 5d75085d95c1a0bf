import gzip
import hashlib
import os
import random
import subprocess
import zlib

import pytest
import tensorflow as tf

from beam_jobs.shards import QUIET_END, READ_STEP, RecordFile, RollingShards, StagedFileChanged, placed, prune, rearrange, unit
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


# ---------------------------------------------------------------- where a member ends
# TensorFlow's GZIP reader (ZlibInputStream) reads a file 256 KiB at a time. When its last read (the one that
# reaches the file's end) leaves a member whose bytes after that read's start inflate to no data (its trailer,
# and an end-of-block code before it), the reader asks for more input, gets none, and ends there: the records
# after it are dropped without an error.

TF_READ = 256 << 10


def _stored(seed: int, size: int) -> bytes:
    """Random bytes: deflate stores them, so their member is the frame plus 23 bytes and inflates up to its trailer."""
    return random.Random(seed).randbytes(size)


def _skewed(seed: int) -> bytes:
    """Bytes deflate codes with Huffman codes; for seed 3 the last two bytes before the trailer hold only the
    end-of-block code, so its last 10 bytes inflate to nothing; for seed 0, its last 9."""
    rng = random.Random(seed)
    return bytes(min(255, int(rng.expovariate(0.05))) for _ in range(2000))


def _ending_at(end: int, last: bytes, first: bytes = b"") -> list[bytes]:
    """Records whose members, as `unit` makes them and one after another, put the end of `last`'s at byte
    `end`: `first`, then random ones sized to fit (39 bytes more each as a member)."""
    records, size, target = [first] if first else [], len(unit(first, "gzip")) if first else 0, len(unit(last, "gzip"))
    while end - size - target > 60_000:
        records.append(_stored(len(records) + 100, 50_000))
        size += len(unit(records[-1], "gzip"))
    records.append(_stored(len(records) + 100, end - size - target - 39))
    assert sum(len(unit(r, "gzip")) for r in records) + target == end  # the layout aimed at
    return records + [last]


TAIL = [_stored(index, 1_400) for index in range(40)]  # 57 KB: the file ends within TensorFlow's last read


def _read_whole(path: str, records: list[bytes]) -> None:
    """TensorFlow, Python's gzip and `gzip -d` read every record of the file."""
    assert [r.numpy() for r in tf.data.TFRecordDataset(path, "GZIP")] == records
    assert [r.numpy() for r in tf.data.TFRecordDataset(path, "GZIP", buffer_size=4 << 20)] == records
    assert len(list(tf.compat.v1.io.tf_record_iterator(path, "GZIP"))) == len(records)
    from components.common.tfrecord import shard_records

    assert list(shard_records(path, "gzip")) == records
    framed = subprocess.run(["gzip", "-dc", path], capture_output=True, check=True).stdout
    assert framed == gzip.decompress(open(path, "rb").read())


@pytest.mark.parametrize(("past", "last"), [
    (1, _stored(1, 1000)), (4, _stored(1, 1000)), (8, _stored(1, 1000)),  # the trailer across the read, or after it
    (9, _skewed(0)), (10, _skewed(3)),  # and before it, bytes that inflate to nothing
    (4 * TF_READ + 8, _stored(1, 1000)),  # a later read, as in a shard of 1.1 MB
])
def test_tensorflow_reads_every_record_wherever_a_member_would_end(tmp_path, past, last):
    records = _ending_at((past if past > TF_READ else TF_READ + past), last) + TAIL
    writer = RecordFile(str(tmp_path / "f"), "gzip")
    for record in records:
        writer.write(record)
    described = writer.close()
    _read_whole(str(tmp_path / "f"), records)
    data = (tmp_path / "f").read_bytes()
    assert (described["bytes"], described["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    ends = [*described["starts"][1:], len(data)]
    assert [zlib.decompressobj(31).decompress(data[s:e])[12:-4] for s, e in zip(described["starts"], ends)] == records


@pytest.mark.parametrize("how", ["pruned", "moved"])
@pytest.mark.parametrize(("first", "end"), [(1_000, TF_READ + 8 + 1_039), (65_506, TF_READ + 8 + (64 << 10))])
def test_a_record_placed_in_another_file_is_placed_again(tmp_path, how, first, end):
    """The first record leaves, so the records after it start again in a new file (the pruned copy, or the
    file the moved ones roll into), 1,039 bytes earlier: a member that ended well in the staged file would
    end 8 bytes past 256 KiB. Or 64 KiB + 9 bytes earlier: a member that took a field of 9 bytes in the
    staged file, for ending 8 bytes past 320 KiB, would end there again with it, and ends well without."""
    first = _stored(99, first)
    records = _ending_at(end, _stored(1, 2000), first=first) + TAIL
    shards = RollingShards(str(tmp_path / "staged"), max_bytes=10**7, compression="gzip")
    for record in records:
        shards.write("train", record)
    [staged] = shards.close()
    _read_whole(staged["file"], records)
    moved = [{"file": staged["file"], "index": i, "split": "eval"} for i in range(1, len(records))] \
        if how == "moved" else []
    out = rearrange([staged], [{"file": staged["file"], "index": 0}] if how == "pruned" else [], moved, "gzip",
                    str(tmp_path), 10**7)
    [placed] = [shard for shard in out if shard["records"] == len(records) - 1]
    _read_whole(placed["file"], records[1:])


def test_no_member_ends_just_past_a_read_step_and_each_inflates_as_before():
    """Every offset around a few multiples of the step, for a stored member and a Huffman-coded one; placing
    a placed member again, anywhere, is placing the member itself there."""
    for member in (unit(_stored(1, 1000), "gzip"), unit(_skewed(3), "gzip")):
        for step in (1, 4, 5):
            for offset in range(step * READ_STEP - len(member) - 30, step * READ_STEP - len(member) + 30):
                written = placed(member, offset)
                assert not 0 < (offset + len(written)) % READ_STEP <= QUIET_END
                assert len(written) - len(member) in ((0,) if written == member else range(6, QUIET_END + 1))
                assert gzip.decompress(written) == gzip.decompress(member)
                assert placed(written, offset + 7) == placed(member, offset + 7)
