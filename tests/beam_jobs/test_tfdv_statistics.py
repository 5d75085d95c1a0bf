"""Stoke's statistics against TFDV's own for the same records: the golden span of tests/fixtures/tfdv/.

TFDV 1.16 cannot be installed beside TensorFlow 2.21, so its statistics of the fixture's records
(expected/Split-*/FeatureStats.pb) were made once, in a virtualenv of its own; the fixture's
README.md has the commands, and what TFDV's infer_schema, validate_statistics and visualisation said
of Stoke's files. Here the real ingest job makes the span again from the committed photos, served by
moto's S3 on 127.0.0.1 so that every image/source is the s3:// URI TFDV saw, checks that its records
are exactly the committed ones, and compares its statistics with TFDV's, field by field:

- equal: one unnamed dataset and its num_examples; the features' paths, order and types; every
  common statistic, num_values_histogram included; for strings unique, the top values with their
  frequencies in TFDV's order (count, then value, descending) and the rank histogram; for integers
  min, max, median and num_zeros; for image/encoded (bytes, as TFDV writes it under a schema that
  gives it an image_domain) min and max_num_bytes; and no field beyond these on either side;
- within float tolerance: mean, std_dev, avg_length and avg_num_bytes (TFDV sums in another order;
  avg_length is a float32);
- allowed to differ: the bucket edges and counts of the STANDARD and QUANTILES histograms. TFDV
  derives both from a quantile sketch and interpolates counts (8.004 records in a bucket that holds 8,
  0.004 in an empty one); Stoke counts the sorted values. What both promise is held: the histograms'
  types and order, 10 buckets (1 for a constant), the range min..max, counts summing to num_examples;
- Stoke's alone, which TFDV's tools pass over: custom_stats (the picture's measures and domain_info
  on image/encoded, label conflicts on image/class/text).
"""
import copy
from pathlib import Path

import pytest
from tensorflow_metadata.proto.v0 import statistics_pb2

from beam_jobs.statistics import statistics
from components.contracts import schema
from components.contracts.layout import Root
from tests.fixtures.tfdv import span as golden

Statistics = statistics_pb2.DatasetFeatureStatisticsList
NUMERIC = ("mean", "std_dev")


@pytest.fixture(scope="module")
def fixture_span(s3_endpoint, tmp_path_factory):
    """The fixture's photos ingested by the real job; (ROOT, span number)."""
    golden.upload()
    root = str(tmp_path_factory.mktemp("tfdv") / "root")
    return root, golden.ingest(root)["span"]


def load(path) -> Statistics:
    return Statistics.FromString(Path(path).read_bytes())


def test_ingest_makes_exactly_the_records_tfdv_described(fixture_span):
    root, number = fixture_span
    for split in schema.SPLITS:
        made = golden.records(Root(root).span(number), split)
        assert made and made == golden.records(golden.RECORDS, split), (
            f"the fixture's {split} records changed: remake them (tests/fixtures/tfdv/README.md)")


@pytest.mark.parametrize("split", schema.SPLITS)
def test_statistics_are_tfdvs_for_the_same_records(fixture_span, split):
    root, number = fixture_span
    mine = load(Root(root).statistics(number, split))
    theirs = load(golden.HERE / "expected" / f"Split-{split}" / "FeatureStats.pb")
    assert len(mine.datasets) == len(theirs.datasets) == 1
    ours, tfdv = mine.datasets[0], theirs.datasets[0]
    assert [(f.path.step[0], f.type) for f in ours.features] == [(f.path.step[0], f.type) for f in tfdv.features]
    assert sorted(f.path.step[0] for f in ours.features) == sorted(schema.feature_spec())
    for a, b in zip(ours.features, tfdv.features):
        a, b = comparable(a, b, tfdv.num_examples)
        assert str(a) == str(b)
    assert (ours.name, ours.num_examples) == (tfdv.name, tfdv.num_examples) == ("", len(golden.records(
        golden.RECORDS, split)))


def comparable(mine, theirs, count: int):
    """Copies of two features' statistics with what may differ checked here and then made equal."""
    mine, theirs = copy.deepcopy(mine), copy.deepcopy(theirs)
    assert not theirs.custom_stats
    mine.ClearField("custom_stats")
    kind = theirs.WhichOneof("stats")
    assert mine.WhichOneof("stats") == kind
    ours, tfdv = getattr(mine, kind), getattr(theirs, kind)
    fields = {"num_stats": NUMERIC, "string_stats": ("avg_length",), "bytes_stats": ("avg_num_bytes",)}[kind]
    for field in fields:
        assert getattr(ours, field) == pytest.approx(getattr(tfdv, field), rel=1e-6), (mine.path.step[0], field)
        setattr(ours, field, getattr(tfdv, field))
    if kind == "num_stats":
        same_promises(ours.histograms, tfdv.histograms, count, tfdv.min, tfdv.max)
        ours.ClearField("histograms")
        tfdv.ClearField("histograms")
    return mine, theirs


def same_promises(mine, theirs, count: int, low: float, high: float) -> None:
    assert [h.type for h in mine] == [h.type for h in theirs] == [statistics_pb2.Histogram.STANDARD,
                                                                  statistics_pb2.Histogram.QUANTILES]
    for ours, tfdv in zip(mine, theirs):
        assert len(ours.buckets) == len(tfdv.buckets) == (1 if low == high else 10)
        for histogram in (ours, tfdv):
            assert (histogram.buckets[0].low_value, histogram.buckets[-1].high_value) == (low, high)
            assert sum(b.sample_count for b in histogram.buckets) == pytest.approx(count)


def signatures(count: int, split="train", label=lambda i: "cat", size=lambda i: (32, 24)) -> list[dict]:
    return [{"split": split, "label": label(i), "uri": f"s3://b/{i:05d}.jpg", "format": "jpeg", "bytes": 1000 + i,
             "width": size(i)[0], "height": size(i)[1], "mean": 100.0 + i % 7, "std": 20.0} for i in range(count)]


def test_a_split_without_records_is_one_empty_dataset_as_tfdv_writes_it():
    found = statistics(signatures(3), [], ["cat"])
    assert found["eval"].SerializeToString() == b"\n\x00"  # TFDV 1.16's bytes for a split of no records
    assert found["train"].datasets[0].num_examples == 3


def test_many_values_keep_tfdvs_top_20_and_1000_ranks_but_every_class():
    many = signatures(1200, label=lambda i: f"class-{i % 1100:04d}")
    features = {f.path.step[0]: f for f in statistics(many, [], sorted({s["label"] for s in many}))["train"]
                .datasets[0].features}
    source, text = features[schema.SOURCE].string_stats, features[schema.TEXT].string_stats
    assert (source.unique, len(source.top_values), len(source.rank_histogram.buckets)) == (1200, 20, 1000)
    assert source.top_values[0].value == "s3://b/01199.jpg"  # ties: the greatest value first, as TFDV
    assert (text.unique, len(text.top_values), len(text.rank_histogram.buckets)) == (1100, 20, 1100)
    assert [b.low_rank for b in text.rank_histogram.buckets] == list(range(1100))
    assert [(v.value, v.frequency) for v in text.top_values[:2]] == [("class-0099", 2), ("class-0098", 2)]


def test_a_constant_has_one_standard_bucket_and_label_ids_follow_labels_json():
    found = statistics(signatures(5, label=lambda i: "a" if i < 2 else "z"), [], ["z", "a"])["train"]
    features = {f.path.step[0]: f for f in found.datasets[0].features}
    width, label = features[schema.WIDTH].num_stats, features[schema.LABEL].num_stats
    assert [(b.low_value, b.high_value, b.sample_count) for b in width.histograms[0].buckets] == [(32, 32, 5)]
    assert [(b.low_value, b.high_value) for b in width.histograms[1].buckets] == [(32, 32)] * 10
    assert (label.num_zeros, label.min, label.max, label.mean) == (3, 0, 1, pytest.approx(0.4))  # "z" is id 0


@pytest.mark.parametrize("split", ["test", "../train", "Split-train", ""])
def test_the_layout_names_only_the_two_splits(split):
    with pytest.raises(ValueError, match="no split"):
        Root("/r").statistics(1, split)
