"""A span's statistics as TFX's StatisticsGen writes them: statistics/Split-<split>/FeatureStats.pb, each a
DatasetFeatureStatisticsList with one dataset, whose features are the records' seven features with
the statistics TFDV's generator computes for their types (its default StatsOptions), so that TFDV's
load_stats_binary, infer_schema, validate_statistics and visualisation take them as their own.

- every feature: common stats, num_values_histogram (QUANTILES; every record holds exactly one value
  of each feature, which is what the schema's encoder writes);
- image/height, image/width, image/class/label (INT): mean, std_dev, min, median, max, num_zeros, a
  STANDARD and a QUANTILES histogram of 10 buckets;
- image/format, image/class/text, image/source (STRING): unique, the 20 top values, avg_length in
  UTF-8 bytes, a rank histogram of 1000 buckets, ties ordered as TFDV orders them (value descending).
  image/class/text's rank histogram holds every class, however many (as TFDV's does with
  num_rank_histogram_buckets raised): the data check counts labels from it;
- image/encoded (BYTES, as TFDV writes it when the schema gives the feature an image_domain):
  avg/min/max_num_bytes.

What describes the picture but is no record feature (grey-level mean and spread, aspect ratio,
encoded size; the count of each image-quality issue, `quality.<issue>`) is kept as custom_stats of image/encoded, the feature it
measures, where TFDV's own image statistics generator puts its image measures (image_max_width,
image_format_histogram): one file per split, as TFX reads it, and no name that infer_schema or
validate_statistics could take for a column of the records, nor any they read: no `domain_info` (TFDV's
semantic-domain hint, which validate_statistics holds against the schema as an error wherever the
schema lacks that domain), so every TFDV call treats these files as it treats its own.

Exact where TFDV sketches: the median, the quantiles and the standard histogram's counts come from
the sorted values, not from a quantile sketch, so their bucket edges and counts differ from TFDV's
interpolated ones (tests/beam_jobs/test_tfdv_statistics.py says which fields match TFDV's exactly).

Computed in the driver from the kept records' signatures (a few hundred bytes each, already in
memory for the duplicate check): no second pass over the image bytes, every count is the number of
records the span's shards hold, and each split's columns are numpy arrays summed once, not per record.
"""
from __future__ import annotations

import heapq
from collections import Counter
from operator import itemgetter

import numpy as np
from tensorflow_metadata.proto.v0 import statistics_pb2

from beam_jobs.quality import WORDS as QUALITY_ISSUES
from components.common.files import write_bytes
from components.contracts import schema
from components.contracts.layout import Root
from components.contracts.results import Anomaly, LabelConflict

EXAMPLES = 20  # label conflicts named in the manifest; the count covers them all
# TFDV's StatsOptions defaults: num_top_values, num_rank_histogram_buckets, num_histogram_buckets,
# num_quantiles_histogram_buckets and num_values_histogram_buckets.
TOP_VALUES, RANK_BUCKETS, BUCKETS = 20, 1000, 10
Feature = statistics_pb2.FeatureNameStatistics
Histogram = statistics_pb2.Histogram
Statistics = statistics_pb2.DatasetFeatureStatisticsList
INTEGERS = (schema.HEIGHT, schema.WIDTH, schema.LABEL)
STRINGS = {schema.FORMAT: "format", schema.TEXT: "label", schema.SOURCE: "uri"}  # feature -> signature key
FEATURES = tuple(sorted((*INTEGERS, *STRINGS, schema.ENCODED)))  # TFDV's order: by path
# Measures of the picture, custom_stats of image/encoded: name -> its values from a split's columns.
MEASURES = {
    "pixel_mean": lambda c: c["mean"],  # grey level, 0-255, of the picture as ingest decoded it
    "pixel_std": lambda c: c["std"],
    "aspect_ratio": lambda c: c[schema.WIDTH] / c[schema.HEIGHT],
    "encoded_bytes": lambda c: c[schema.ENCODED],
}
MEASURE_STATISTICS = ("mean", "std_dev", "min", "max")  # each a custom statistic `<measure>.<statistic>`


def label_conflicts(conflicts: list[LabelConflict]) -> list[Anomaly]:
    if not conflicts:
        return []
    return [Anomaly(kind="label_conflict", count=len(conflicts), examples=conflicts[:EXAMPLES])]


def statistics(kept: list[dict], anomalies: list[Anomaly], labels: list[str]) -> dict[str, Statistics]:
    """Split -> its statistics, from the signatures of the records the span keeps; `labels` gives
    each label its id (image/class/label)."""
    ids = {name: index for index, name in enumerate(labels)}
    return {split: split_statistics([s for s in kept if s["split"] == split], ids, anomalies)
            for split in schema.SPLITS}


def write_statistics(root: Root, number: int, kept: list[dict], anomalies: list[Anomaly], labels: list[str]) -> None:
    for split, found in statistics(kept, anomalies, labels).items():
        write_bytes(root.statistics(number, split), found.SerializeToString())


def split_statistics(records: list[dict], ids: dict[str, int], anomalies: list[Anomaly]) -> Statistics:
    """One split's DatasetFeatureStatisticsList; a split without records has a dataset of 0 examples
    and no features, as TFDV writes one."""
    result = Statistics()
    dataset = result.datasets.add(num_examples=len(records))
    if not records:
        return result
    columns = _columns(records, ids)
    for name in FEATURES:
        if name in INTEGERS:
            _numbers(_feature(dataset, name, Feature.INT).num_stats, columns[name])
        elif name in STRINGS:
            _strings(_feature(dataset, name, Feature.STRING).string_stats, columns[name],
                     None if name == schema.TEXT else RANK_BUCKETS)
        else:
            _image(_feature(dataset, name, Feature.BYTES), columns)
    encoded = next(f for f in dataset.features if f.path.step[0] == schema.ENCODED)
    issues = Counter(issue for r in records for issue in r.get("issues", ()))
    for issue in QUALITY_ISSUES:  # records ingest scored with each (beam_jobs/quality.py), set aside or not
        encoded.custom_stats.add(name=f"quality.{issue}", num=issues[issue])
    text = next(f for f in dataset.features if f.path.step[0] == schema.TEXT)
    for anomaly in anomalies:  # the span's, on each split: a conflict's copy is in neither
        text.custom_stats.add(name=f"{anomaly.kind}s", num=anomaly.count)
    return result


def _columns(records: list[dict], ids: dict[str, int]) -> dict:
    """A split's signatures as columns: numpy arrays for numbers, lists for strings; each built by
    one C-level map over the records (a Python loop per record costs more than all the rest)."""
    columns = {name: list(map(itemgetter(key), records)) for name, key in STRINGS.items()}
    numbers = np.array(list(map(itemgetter("height", "width", "bytes", "mean", "std"), records)), np.float64)
    columns.update(zip((schema.HEIGHT, schema.WIDTH, schema.ENCODED, "mean", "std"), numbers.T))
    columns[schema.LABEL] = np.array(list(map(ids.__getitem__, columns[schema.TEXT])), np.float64)
    return columns


def _feature(dataset, name: str, kind) -> Feature:
    feature = dataset.features.add(type=kind)
    feature.path.step.append(name)
    return feature


def _common(common, count: int) -> None:
    common.num_non_missing = common.tot_num_values = count
    common.min_num_values = common.max_num_values = 1
    common.avg_num_values = 1.0
    values = common.num_values_histogram
    values.type = Histogram.QUANTILES
    for _ in range(BUCKETS):
        values.buckets.add(low_value=1.0, high_value=1.0, sample_count=count / BUCKETS)


def _numbers(stats, values: np.ndarray) -> None:
    _common(stats.common_stats, len(values))
    ordered = np.sort(values)
    stats.mean, stats.std_dev = float(values.mean()), float(values.std())
    stats.min, stats.max = float(ordered[0]), float(ordered[-1])
    stats.median = float(ordered[len(ordered) // 2])  # the upper median: a value, as TFDV's sketch gives one
    stats.num_zeros = int(np.count_nonzero(values == 0))
    _standard(stats.histograms.add(type=Histogram.STANDARD), ordered)
    quantiles = stats.histograms.add(type=Histogram.QUANTILES)
    edges = np.quantile(ordered, np.linspace(0, 1, BUCKETS + 1))
    for low, high in zip(edges[:-1], edges[1:]):
        quantiles.buckets.add(low_value=float(low), high_value=float(high), sample_count=len(values) / BUCKETS)


def _standard(histogram, ordered: np.ndarray) -> None:
    """Equal-width buckets from min to max, as TFDV's; one bucket when every value is the same."""
    low, high = float(ordered[0]), float(ordered[-1])
    if low == high:
        histogram.buckets.add(low_value=low, high_value=high, sample_count=float(len(ordered)))
        return
    counts, edges = np.histogram(ordered, bins=BUCKETS, range=(low, high))
    for count, start, end in zip(counts, edges[:-1], edges[1:]):
        histogram.buckets.add(low_value=float(start), high_value=float(end), sample_count=float(count))


def _strings(stats, values: list[str], buckets: int | None) -> None:
    """String statistics; the rank histogram holds the `buckets` most frequent values (None: all)."""
    _common(stats.common_stats, len(values))
    counts = Counter(values)
    stats.unique = len(counts)
    stats.avg_length = sum(map(len, map(str.encode, values))) / len(values)  # UTF-8 bytes, as TFDV counts
    limit = buckets or len(counts)
    if len(counts) == len(values):  # each value once (image/source): the greatest, compared as they are
        ranked = [(value, 1) for value in heapq.nlargest(limit, values)]
    else:  # by count, then value, both descending
        ranked = heapq.nlargest(limit, counts.items(), key=itemgetter(1, 0))
    for value, count in ranked[:TOP_VALUES]:
        stats.top_values.add(value=value, frequency=count)
    for rank, (value, count) in enumerate(ranked):
        stats.rank_histogram.buckets.add(low_rank=rank, high_rank=rank, label=value, sample_count=count)


def _image(feature: Feature, columns: dict) -> None:
    stats, sizes = feature.bytes_stats, columns[schema.ENCODED]
    _common(stats.common_stats, len(sizes))
    stats.avg_num_bytes, stats.min_num_bytes = float(sizes.mean()), float(sizes.min())
    stats.max_num_bytes, stats.max_num_bytes_int = float(sizes.max()), int(sizes.max())
    for measure, value in MEASURES.items():
        values = value(columns)
        for name, number in zip(MEASURE_STATISTICS, (values.mean(), values.std(), values.min(), values.max())):
            feature.custom_stats.add(name=f"{measure}.{name}", num=float(number))
        _standard(feature.custom_stats.add(name=f"{measure}.histogram").histogram, np.sort(values))
