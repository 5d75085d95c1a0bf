"""The classes a span's records carry, and the label set of a model trained on spans.

A span's manifest lists the labels as they were when ingest published it (labels.json then, which ingest
appends to before the data check has judged the new classes), not the classes its records carry: a span
published after one the check held back lists the held span's classes too. What the records carry is in the
span's statistics: image/class/text's rank histogram holds every class (beam_jobs/statistics.py). Where the
statistics are missing or do not count what the manifest counts, the span's records are read instead.

A model's label set (contracts/label_set.py) is what the spans it trains on carry, so a held span changes
nothing until it is released: ids 0 to the highest one their records carry, named by their manifests, with
the ids below it that none of their records carries kept in place and never answered.
"""
from __future__ import annotations

from collections import Counter

from components.common.files import filesystem, join
from components.common.spans import Spans
from components.common.tfrecord import BadRecord, shard_records
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.schema import SPLITS, TEXT, example_bytes


def label_counts(statistics) -> Counter:
    """Records per label name in a DatasetFeatureStatisticsList, from image/class/text's rank histogram."""
    counts = Counter()
    for feature in (f for dataset in statistics.datasets for f in dataset.features):
        if (feature.path.step[0] if feature.path.step else feature.name) == TEXT:
            counts.update({b.label: int(b.sample_count) for b in feature.string_stats.rank_histogram.buckets})
    return counts


def span_classes(root: Root, manifest: SpanManifest) -> set[str]:
    """The label names the span's records carry: from its statistics, or from its records where the statistics
    of a split are missing, unreadable or count other than its manifest."""
    found = set()
    for split in SPLITS:
        counts = _counted(root.statistics(manifest.span, split))
        if counts is None or sum(counts.values()) != getattr(manifest.counts, split):
            return _read(root, manifest)
        found |= {name for name, count in counts.items() if count}
    return found


def label_set(root: Root | str, spans: list[int] | None = None) -> LabelSet:
    """The label set of a model trained on the checked `spans` (every checked span when None). Raises
    SpanNotChecked for a span named that the check has not let in, ResultError for one whose classes cannot be
    read."""
    root = root if isinstance(root, Root) else Root(root)
    names, carried = [], set()
    for manifest in Spans(root).each_manifest(spans, sources=False):
        if len(manifest.labels) > len(names):
            names = list(manifest.labels)
        classes = span_classes(root, manifest)
        unlisted = sorted(classes - set(manifest.labels))
        if unlisted:
            raise ResultError(f"span {manifest.span}'s records carry labels its manifest does not list "
                              f"({', '.join(unlisted)}): restore the span's folder from a backup")
        carried |= {manifest.labels.index(name) for name in classes}
    labels = names[:max(carried, default=-1) + 1]
    return LabelSet(labels, [name for index, name in enumerate(labels) if index not in carried])


def _counted(uri: str) -> Counter | None:
    """The label counts of the statistics file at `uri`; None when it is missing or no statistics."""
    from google.protobuf.message import DecodeError
    from tensorflow_metadata.proto.v0 import statistics_pb2

    fs, path = filesystem(uri)
    statistics = statistics_pb2.DatasetFeatureStatisticsList()
    try:
        statistics.ParseFromString(fs.cat_file(path))
    except (FileNotFoundError, DecodeError):
        return None
    return label_counts(statistics)


def _read(root: Root, manifest: SpanManifest) -> set[str]:
    """The label names of the span's records, read from its shards."""
    found = set()
    for entry in manifest.shards:
        shard = join(root.span(manifest.span), entry.file)
        try:
            found |= {example_bytes(record)[TEXT].decode() for record in shard_records(shard, manifest.compression)}
        except (BadRecord, OSError, ValueError, KeyError) as error:
            raise ResultError(f"span {manifest.span}'s classes cannot be read: its statistics do not count its records, "
                              f"and its shard {shard} cannot be read ({error}); restore the span from a backup") from None
    return found
