"""Each transform of the ingest job under Beam's TestPipeline."""
import gzip
import io
import json

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs import ingest_pipeline
from beam_jobs.ingest_pipeline import DEAD, SIGNATURES, Gather, Normalize, WriteShards
from beam_jobs.records import Conversion, read_source
from beam_jobs.shards import unit
from components.common.beam_runner import runner_for
from components.common.files import read_json
from components.common.images import Rejected
from components.common.tfrecord import read_records
from components.contracts import schema
from tests.beam_jobs import images


def local_pipeline() -> TestPipeline:
    """Beam's TestPipeline on the runner Stoke's local jobs run on (components/common/beam_runner.py): its
    DirectRunner would first download a Prism binary from github.com, without a timeout."""
    return TestPipeline(runner=runner_for(PipelineOptions([])))


def source(path, label="cat", split="train"):
    return {"uri": str(path), "label": label, "label_id": 0, "split": split, "size": 1, "version": "1"}


def test_normalize_splits_good_records_from_dead_letters(tmp_path):
    (tmp_path / "good.png").write_bytes(images.rgb_png())
    (tmp_path / "bad.jpg").write_bytes(images.truncated_jpeg())
    sources = [source(tmp_path / "good.png", split="eval"), source(tmp_path / "bad.jpg"),
               source(tmp_path / "gone.jpg")]
    with local_pipeline() as p:
        normalized = p | beam.Create(sources) | beam.ParDo(Normalize(Conversion())).with_outputs(DEAD, main="good")
        good, bad = normalized.good, normalized[DEAD]
        parsed = good | beam.MapTuple(
            lambda split, unit, _: (split, tf.train.Example.FromString(_record(unit))
                                 .features.feature[schema.SOURCE].bytes_list.value[0].decode()))
        assert_that(parsed, equal_to([("eval", str(tmp_path / "good.png"))]), label="good")
        reasons = bad | beam.Map(lambda d: (d["uri"].rsplit("/", 1)[-1], d["reason"][:20]))
        assert_that(reasons, equal_to([("bad.jpg", "truncated or corrupt"), ("gone.jpg", "not found: removed a")]),
                    label="bad")


def test_a_file_over_the_size_cap_is_refused_unopened_and_read_no_further_than_the_cap(tmp_path):
    listed_large = {"uri": str(tmp_path / "never-opened.jpg"), "size": 100 << 20}
    with pytest.raises(Rejected, match=r"^file too large: 100.0 MB, more than the limit of 64 MB"):
        read_source(listed_large, 64 << 20)  # "not found" would mean it was opened
    grown = tmp_path / "grown.jpg"
    grown.write_bytes(images.rgb_jpeg() + b"\0" * (3 << 20))  # listed small, then it grew
    with pytest.raises(Rejected, match="file too large"):
        read_source({"uri": str(grown), "size": 1000}, 2 << 20)
    assert read_source({"uri": str(grown), "size": 1000}, None) == grown.read_bytes()
    whole = grown.stat().st_size  # grown to the cap exactly, listed as it is, and shrunk since it was listed
    for listed, cap in ((1000, whole), (whole, whole), (whole + 5000, whole + 5000)):
        assert read_source({"uri": str(grown), "size": listed}, cap) == grown.read_bytes()
    with pytest.raises(Rejected, match="file too large"):
        read_source({"uri": str(grown), "size": whole}, whole - 1)


def _record(unit: bytes) -> bytes:
    """The record of a GZIP unit (the default Conversion's): one member holding one frame."""
    [record] = read_records(io.BytesIO(gzip.decompress(unit)))
    return record


def test_write_shards_and_gather(tmp_path):
    records = [("train", b"t%d" % i) for i in range(10)] + [("eval", b"e")]
    units = [(split, unit(record, "gzip")) for split, record in records]
    with local_pipeline() as p:
        _ = (p | beam.Create(units) | beam.ParDo(WriteShards(str(tmp_path), 8, "gzip"))
             | Gather(str(tmp_path / "shards.json")))
    shards = read_json(str(tmp_path / "shards.json"))
    assert sum(s["records"] for s in shards if s["split"] == "train") == 10
    assert max(s["records"] for s in shards) <= 4  # rolled at 8 bytes of 2-3 byte records
    written = sorted(r.numpy() for s in shards for r in tf.data.TFRecordDataset(s["file"], "GZIP"))
    assert written == sorted(r for _, r in records)


def test_signatures_roll_over_into_files_of_a_bounded_size(tmp_path, monkeypatch):
    """A bundle holds at most SIGNATURES_PER_FILE signatures in memory: on DirectRunner a bundle is a share of
    the whole arrival."""
    monkeypatch.setattr(ingest_pipeline, "SIGNATURES_PER_FILE", 3)
    records = [("train", unit(b"t%d" % i, "gzip"), {"uri": f"t{i}"}) for i in range(10)]
    with local_pipeline() as p:
        written = p | beam.Create(records) | beam.ParDo(WriteShards(str(tmp_path), 1 << 20, "gzip")).with_outputs(
            SIGNATURES, main="shards")
        _ = written[SIGNATURES] | Gather(str(tmp_path / "signatures.json"))
    files = read_json(str(tmp_path / "signatures.json"))
    lines = [[json.loads(line) for line in open(f)] for f in files]
    assert sorted(len(each) for each in lines) == [1, 3, 3, 3]
    signatures = sorted((s for each in lines for s in each), key=lambda s: s["index"])
    assert [s["index"] for s in signatures] == list(range(10)) and len({s["file"] for s in signatures}) == 1
    written = [r.numpy() for r in tf.data.TFRecordDataset(signatures[0]["file"], "GZIP")]
    assert [written[s["index"]] for s in signatures] == [s["uri"].encode() for s in signatures]


def test_gather_of_nothing_is_an_empty_list(tmp_path):
    with local_pipeline() as p:
        _ = p | beam.Create([]) | Gather(str(tmp_path / "dead.json"))
    assert read_json(str(tmp_path / "dead.json")) == []
