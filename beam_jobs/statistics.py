"""A span's statistics.pb: what TFDV would write, a DatasetFeatureStatisticsList with one dataset
per split, so a data-check stage (or TFDV's visualisation) reads it as it reads TFDV's own.

Computed in the driver from the kept records' signatures (a few hundred bytes each, already in
memory for the duplicate check): no second pass over the image bytes, and every count is the
number of records the span's shards hold.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
from tensorflow_metadata.proto.v0 import statistics_pb2

from components.common.files import filesystem
from components.contracts import schema
from components.contracts.results import Anomaly, LabelConflict

EXAMPLES = 20  # label conflicts named in the manifest; the count covers them all
BUCKETS = 10
Feature = statistics_pb2.FeatureNameStatistics
NUMERIC = {  # feature -> (type, value of a signature)
    "image/width": (Feature.INT, lambda s: s["width"]),
    "image/height": (Feature.INT, lambda s: s["height"]),
    "image/aspect_ratio": (Feature.FLOAT, lambda s: s["width"] / s["height"]),
    "image/encoded_bytes": (Feature.INT, lambda s: s["bytes"]),
    "image/pixel_mean": (Feature.FLOAT, lambda s: s["mean"]),
    "image/pixel_std": (Feature.FLOAT, lambda s: s["std"]),
}
CATEGORICAL = {schema.TEXT: lambda s: s["label"], schema.FORMAT: lambda s: s["format"]}


def label_conflicts(conflicts: list[LabelConflict]) -> list[Anomaly]:
    if not conflicts:
        return []
    return [Anomaly(kind="label_conflict", count=len(conflicts), examples=conflicts[:EXAMPLES])]


def statistics(kept: list[dict], anomalies: list[Anomaly]) -> statistics_pb2.DatasetFeatureStatisticsList:
    result = statistics_pb2.DatasetFeatureStatisticsList()
    for split in schema.SPLITS:
        records = [s for s in kept if s["split"] == split]
        dataset = result.datasets.add(name=split, num_examples=len(records))
        for name, (kind, value) in NUMERIC.items():
            _numeric(_feature(dataset, name, kind, len(records)), np.array([value(r) for r in records], float))
        for name, value in CATEGORICAL.items():
            feature = _feature(dataset, name, Feature.STRING, len(records))
            _categorical(feature, [value(r) for r in records])
            if name == schema.TEXT:
                for anomaly in anomalies:  # the span's, on each split: a conflict's copy is in neither
                    feature.custom_stats.add(name=f"{anomaly.kind}s", num=anomaly.count)
    return result


def write_statistics(uri: str, kept: list[dict], anomalies: list[Anomaly]) -> None:
    fs, path = filesystem(uri)
    fs.pipe_file(path, statistics(kept, anomalies).SerializeToString())


def _feature(dataset, name: str, kind, count: int):
    feature = dataset.features.add(type=kind)
    feature.path.step.append(name)
    common = feature.string_stats.common_stats if kind == Feature.STRING else feature.num_stats.common_stats
    common.num_non_missing, common.num_missing, common.tot_num_values = count, 0, count
    if count:
        common.min_num_values = common.max_num_values = 1
        common.avg_num_values = 1.0
    return feature


def _numeric(feature, values: np.ndarray) -> None:
    stats = feature.num_stats
    if not len(values):
        return
    stats.mean, stats.std_dev = float(values.mean()), float(values.std())
    stats.min, stats.max, stats.median = float(values.min()), float(values.max()), float(np.median(values))
    stats.num_zeros = int((values == 0).sum())
    standard = stats.histograms.add(type=statistics_pb2.Histogram.STANDARD)
    counts, edges = np.histogram(values, bins=BUCKETS)
    for count, low, high in zip(counts, edges[:-1], edges[1:]):
        standard.buckets.add(low_value=float(low), high_value=float(high), sample_count=float(count))
    quantiles = stats.histograms.add(type=statistics_pb2.Histogram.QUANTILES)
    edges = np.quantile(values, np.linspace(0, 1, BUCKETS + 1))
    for low, high in zip(edges[:-1], edges[1:]):
        quantiles.buckets.add(low_value=float(low), high_value=float(high), sample_count=len(values) / BUCKETS)


def _categorical(feature, values: list[str]) -> None:
    stats = feature.string_stats
    counts = Counter(values)
    stats.unique = len(counts)
    if values:
        stats.avg_length = sum(map(len, values)) / len(values)
    for rank, (value, count) in enumerate(counts.most_common()):
        stats.top_values.add(value=value, frequency=count)
        stats.rank_histogram.buckets.add(low_rank=rank, high_rank=rank, label=value, sample_count=count)
