import hashlib

import pytest
import tensorflow as tf

from beam_jobs.shards import RecordFile, RollingShards, prune
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
