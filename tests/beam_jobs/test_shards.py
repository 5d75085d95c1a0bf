import pytest
import tensorflow as tf

from beam_jobs.shards import RecordFile, RollingShards
from components.contracts.layout import TF_COMPRESSION


@pytest.mark.parametrize("compression", ["gzip", "zlib", "none"])
def test_tensorflow_reads_what_the_writer_frames(tmp_path, compression):
    records = [b"", b"a", bytes(range(256)) * 100]
    writer = RecordFile(str(tmp_path / "f"), compression)
    for record in records:
        writer.write(record)
    described = writer.close()
    assert described["records"] == 3 and described["bytes"] == (tmp_path / "f").stat().st_size
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
