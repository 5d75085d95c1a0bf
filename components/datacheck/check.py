"""The data check's core: a span's statistics against its history's, decided without any I/O.

`profile` reads what the checks need from a span's statistics, one tensorflow_metadata
DatasetFeatureStatisticsList of one dataset per split (what ingest writes as
statistics/Split-<split>/FeatureStats.pb, as TFX's StatisticsGen does); `decide` compares a span's profile with the
history's and returns the anomalies, each an error (the span is quarantined) or a warning (reported).
The class mix is judged as arrivals come (mix.py): a change of mix warns, a new label or a class gone for
good quarantines.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

from tensorflow_metadata.proto.v0 import statistics_pb2

from components.common.program import setting_hint
from components.common.span_labels import label_counts
from components.contracts.config import DataCheckConfig
from components.contracts.results import Anomaly, QualityFinding, SamePicture
from components.contracts.summaries import DataAnomaly
from components.datacheck import mix

EXAMPLES = mix.EXAMPLES  # URIs named per anomaly; the count covers them all
SIZES = {"image/width": "width", "image/height": "height"}


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the checks need of one span's statistics."""

    labels: dict[str, Counter]  # split -> class -> records
    ranges: dict[str, tuple[float, float]]  # image/width, image/height -> (min, max) over the splits
    buckets: dict[str, list[tuple[float, float, float]]]  # the same -> standard histogram (low, high, count)

    def label_counts(self, split: str | None = None) -> Counter:
        """Records per class, of one split or all."""
        return sum((c for s, c in self.labels.items() if split in (None, s)), Counter())


@dataclasses.dataclass
class Verdict:
    anomalies: list[DataAnomaly]
    label_counts: dict[str, int]
    history_label_counts: dict[str, int]
    label_drift: float | None

    @property
    def errors(self) -> list[DataAnomaly]:
        return [a for a in self.anomalies if a.severity == "error"]


def profile(statistics: dict[str, statistics_pb2.DatasetFeatureStatisticsList]) -> Profile:
    """Split -> its statistics (one dataset each) to a Profile. Label counts are read off the rank
    histogram, which holds every class where the top values hold 20."""
    labels, ranges, buckets = {}, {}, {}
    for split, found in statistics.items():
        labels[split] = label_counts(found)
        for feature in (f for dataset in found.datasets for f in dataset.features):
            name = feature.path.step[0] if feature.path.step else feature.name
            if name in SIZES and feature.num_stats.common_stats.num_non_missing:
                stats = feature.num_stats
                low, high = ranges.get(name, (stats.min, stats.max))
                ranges[name] = (min(low, stats.min), max(high, stats.max))
                buckets.setdefault(name, []).extend(
                    (b.low_value, b.high_value, b.sample_count) for h in stats.histograms
                    if h.type == statistics_pb2.Histogram.STANDARD for b in h.buckets)
    return Profile(labels, ranges, buckets)


def decide(span: int, new: Profile, history: dict[int, Profile], config: DataCheckConfig, *, classes: list[str],
           conflicts: list[Anomaly] = (), same_picture: SamePicture | None = None,
           dhashes: dict[str, list[str]] | None = None,
           quality: list[QualityFinding] = (), examples: dict[str, list[str]] | None = None,
           gone: dict[int, set[str]] | None = None) -> Verdict:
    """Every check of span `span` against `history` (span -> profile: the spans the check let in); without
    history only those that need none (conflicts, floods, rare classes within the span, image quality).
    `conflicts` are the manifest's anomalies; `same_picture` is the manifest's largest group of files that are
    one picture, and `dhashes` (read for a span published before ingest judged that) maps each dHash of the
    span to its records' URIs;
    `quality` are the manifest's quality findings; `examples` maps a label to a few of its records' URIs;
    `gone` maps a released span to the classes its release accepted as gone (mix.released_gone)."""
    counts = {n: history[n].label_counts() for n in sorted(history)}
    mine = new.label_counts()
    theirs = sum(counts.values(), Counter())
    anomalies = label_conflicts(conflicts)
    drift = None
    if history and sum(mine.values()) and sum(theirs.values()):
        drift, shifted = mix.label_drift(span, mine, theirs, config.max_label_drift, mix.past_drifts(counts))
        anomalies += mix.new_labels(span, mine, theirs, examples or {})
        anomalies += mix.absent_classes(span, mine, counts, config.vanished_after, gone or {}) + shifted
    anomalies += same_image_flood(same_picture, dhashes or {}, config.max_same_image_share)
    if history:
        anomalies += image_sizes(new, list(history.values()))
    train = sum((p.label_counts("train") for p in [new, *history.values()]), Counter())
    anomalies += rare_classes(train, classes or sorted(train), config.min_class_examples, bool(history))
    anomalies += image_quality(quality)
    return Verdict(anomalies, dict(sorted(mine.items())), dict(sorted(theirs.items())), drift)


def label_conflicts(found: list[Anomaly]) -> list[DataAnomaly]:
    """Ingest's label conflicts (the manifest's `anomalies`: a count and the first examples), as errors."""
    return [DataAnomaly(
        kind="label_conflict", severity="error", count=a.count, examples=[c.uri for c in a.examples[:EXAMPLES]],
        message=f"{a.count} new images are copies of images labelled otherwise (e.g. {a.examples[0].uri} labelled "
                f"{a.examples[0].label!r} is {a.examples[0].duplicate_of} labelled {a.examples[0].other_label!r})")
        for a in found if a.kind == "label_conflict" and a.count and a.examples]


def same_image_flood(found: SamePicture | None, dhashes: dict[str, list[str]], limit: float) -> list[DataAnomaly]:
    """An error when more than `limit` of the span's files (two at least) are one picture, as ingest judged
    them: exact copies, and near-copies whose block colours agree too, so a fixed camera's distinct frames are
    no flood. A span published before ingest judged it is judged by the one dHash its records share most."""
    if found is None:
        return _same_dhash(dhashes, limit)
    if found.count < 2 or found.count / found.total <= limit:
        return []
    return [DataAnomaly(
        kind="same_image_flood", severity="error", count=found.count, examples=found.examples[:EXAMPLES],
        message=f"{found.count} of the span's {found.total} files ({found.count / found.total:.0%}, over {limit:g}) "
                "are one picture (copies, or frames whose block colours agree): a stuck camera or a looping upload?")]


def _same_dhash(dhashes: dict[str, list[str]], limit: float) -> list[DataAnomaly]:
    """The rule for a span whose manifest does not say which files are one picture. Still an error, not a warning:
    dHash's 9x8 thumbnail cannot tell a stuck camera from a fixed one's distinct frames, only a decode of the span
    again could, and a stuck camera must not train unseen; this rule held such spans back before, and a person who
    looks at the examples releases one in a command."""
    total = sum(map(len, dhashes.values()))
    if not total:
        return []
    dhash, uris = max(sorted(dhashes.items()), key=lambda item: len(item[1]))
    if len(uris) < 2 or len(uris) / total <= limit:
        return []
    return [DataAnomaly(
        kind="same_image_flood", severity="error", count=len(uris), examples=sorted(uris)[:EXAMPLES],
        message=f"{len(uris)} of the span's {total} records ({len(uris) / total:.0%}, over {limit:g}) look the same "
                f"(dHash {dhash}): a stuck camera or a looping upload? (the span was published before ingest told "
                "distinct frames alike at 9x8 apart by their block colours: if they are, release it after a look)")]


def image_sizes(new: Profile, history: list[Profile]) -> list[DataAnomaly]:
    """A warning per dimension whose range leaves the history's; the count is read off the histogram."""
    found = []
    for feature, word in SIZES.items():
        past = [h.ranges[feature] for h in history if feature in h.ranges]
        if feature not in new.ranges or not past:
            continue
        (low, high), floor, top = new.ranges[feature], min(p[0] for p in past), max(p[1] for p in past)
        if floor <= low and high <= top:
            continue
        outside = sum(c for lo, hi, c in new.buckets.get(feature, []) if hi < floor or lo > top)
        found.append(DataAnomaly(
            kind="image_size", severity="warning", count=max(1, round(outside)),
            message=f"image {word}s {low:g}-{high:g} px against the history's {floor:g}-{top:g} px "
                    f"(at least {max(1, round(outside))} records outside)"))
    return found


QUALITY_WORDS = {"blurry": "blurry (little detail: de-focused or shaken)", "dark": "dark", "light": "light (washed out)",
                 "low_information": "low-information (few grey levels)", "odd_aspect_ratio": "of an odd aspect ratio",
                 "odd_size": "of an odd size for the span", "grayscale": "grayscale"}


def image_quality(found: list[QualityFinding]) -> list[DataAnomaly]:
    """Ingest's reported quality issues (the manifest's `quality`), as warnings naming a few images and
    the folders they came from: kept in the span, for a person to look at."""
    anomalies = []
    for finding in found:
        folders = ", ".join(f"{folder} ({count})" for folder, count in finding.folders.items())
        anomalies.append(DataAnomaly(
            kind="image_quality", severity="warning", issue=finding.kind, count=finding.count,
            examples=finding.examples[:EXAMPLES], folders=finding.folders,
            message=f"{finding.count} {'image is' if finding.count == 1 else 'images are'} {QUALITY_WORDS[finding.kind]}, "
                    f"from {folders}; kept: set {'it' if finding.count == 1 else 'them'} aside with "
                    f"{setting_hint('ingest', {'ingest.quality_set_aside': finding.kind})}"))
    return anomalies


def rare_classes(train: Counter, classes: list[str], minimum: int, with_history: bool) -> list[DataAnomaly]:
    where = "the span and its history" if with_history else "the span"
    return [DataAnomaly(kind="rare_class", severity="warning", count=train[name],
                        message=f"class {name!r} has {train[name]} training records in {where} (fewer than {minimum})")
            for name in classes if train[name] < minimum]
