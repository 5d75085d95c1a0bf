"""The model card of a pushed version: assets.extra/model_card.json and model_card.md, beside the lineage
(TF Serving ignores assets.extra, and the serving context mirrors the version with them).

Made from the run's records alone: the lineage (spans, labels, environment), the gate's result (per-class
accuracy, the paired comparison with the version it replaced, its notes), the spans' manifests, statistics
and data-check records, and training's warnings. Its sections follow the headings of Mitchell et al.,
"Model Cards for Model Reporting" (FAT* 2019), where they fit: model details, intended use, factors,
metrics, evaluation data, training data, quantitative analyses, caveats and recommendations.
"""
from __future__ import annotations

import collections

from components.common.files import exists, filesystem, read_result
from components.common.spans import Spans
from components.contracts import schema
from components.contracts.layout import Root
from components.contracts.lineage import CardClass, CardSpan, Lineage, ModelCard
from components.contracts.results import GateResult, SpanManifest, TrainMetrics

CONFIDENCE = 0.95
# A class with fewer eval records than this has an accuracy whose interval is too wide to lean on (at 30
# records, Wilson's 95% interval of 0.8 is 0.63 to 0.90): the card says so.
FEW_RECORDS = 30


def build(root: Root, lineage: Lineage, validation: GateResult, trained: TrainMetrics) -> ModelCard:
    metrics, comparison = validation.metrics, validation.comparison
    checks = Spans(root)
    spans, train_counts, quality = [], collections.Counter(), []
    for span in lineage.spans:
        record = checks.check_record(span.span, span.manifest_sha256).record
        spans.append(CardSpan(span=span.span, created=span.created, source=span.source, train=span.counts.train,
                              eval=span.counts.eval, data_check=record.status if record else None,
                              warnings=[a.message for a in record.anomalies if a.file is None] if record else []))
        counts = _train_label_counts(root, span.span)
        train_counts = None if counts is None or train_counts is None else train_counts + counts
        manifest = read_result(span.manifest_uri, SpanManifest)
        quality += [f"span {span.span}: {finding.count} training images judged {finding.kind.replace('_', ' ')} "
                    "by ingest were kept" for finding in manifest.quality]
        flagged = record.suspected_label_errors() if record else []
        quality += [f"span {span.span}: {len(flagged)} records the label check suspects are mislabelled"] if flagged else []
    compared = {c.label: c for c in comparison.per_class.classes} if comparison and comparison.per_class else {}
    classes = []
    for label in lineage.labels:
        n = metrics.per_class_examples.get(label, 0)
        accuracy = metrics.per_class_accuracy.get(label) if n else None
        right = compared[label].right if label in compared else round((accuracy or 0.0) * n)
        classes.append(CardClass(
            label=label, train_records=train_counts.get(label, 0) if train_counts is not None else None,
            eval_records=n, right=right, accuracy=accuracy, interval=wilson(right, n) if n else None,
            baseline_accuracy=validation.baseline.per_class_accuracy.get(label) if validation.baseline else None,
            verdict=compared[label].verdict if label in compared else None))
    return ModelCard(
        model_name=lineage.model_name, version=lineage.version, run_id=lineage.run_id, pushed_at=lineage.pushed_at,
        network=lineage.training.network, image_size=lineage.training.image_size, labels=lineage.labels,
        spans=spans, classes=classes, example_count=metrics.example_count, accuracy=metrics.accuracy,
        accuracy_interval=wilson(round(metrics.accuracy * metrics.example_count), metrics.example_count),
        top_k=metrics.top_k, top_k_accuracy=metrics.top_k_accuracy, confidence=CONFIDENCE,
        replaced_version=validation.baseline_version, evidence=comparison, gate_notes=validation.notes,
        environment=lineage.environment, limitations=limitations(classes, quality, trained.warnings))


def wilson(right: int, n: int) -> tuple[float, float]:
    """Wilson's score interval of right / n at CONFIDENCE (SciPy's)."""
    from scipy.stats import binomtest

    interval = binomtest(right, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return round(float(interval.low), 4), round(float(interval.high), 4)


def limitations(classes: list[CardClass], quality: list[str], warnings: list[str]) -> list[str]:
    """What the model is known not to do well, or not known to do: classes with few records, classes the gate
    found worse than the replaced version, the data's quality findings, training's warnings."""
    said = []
    for c in classes:
        if c.eval_records < FEW_RECORDS:
            shown = f"{c.accuracy:.2f} ({c.interval[0]:.2f} to {c.interval[1]:.2f})" if c.interval else "not measured"
            said.append(f"{c.label}: only {c.eval_records} eval records; its accuracy, {shown}, is uncertain")
        if c.train_records is not None and c.train_records < FEW_RECORDS:
            said.append(f"{c.label}: only {c.train_records} training records")
        if c.verdict == "worse":
            said.append(f"{c.label}: worse than the version it replaced ({c.accuracy:.2f} against {c.baseline_accuracy:.2f})")
    return said + quality + [f"training: {warning}" for warning in warnings]


def _train_label_counts(root: Root, span: int) -> collections.Counter | None:
    """Records per class of a span's training split, from its statistics (TFDV's rank histogram of the class
    names); None when they cannot be read."""
    from google.protobuf.message import DecodeError
    from tensorflow_metadata.proto.v0 import statistics_pb2

    uri = root.statistics(span, "train")
    if not exists(uri):
        return None
    fs, path = filesystem(uri)
    found = statistics_pb2.DatasetFeatureStatisticsList()
    try:
        found.ParseFromString(fs.cat_file(path))
    except DecodeError:  # a damaged file: the card says the counts are unknown
        return None
    return collections.Counter({bucket.label: int(bucket.sample_count)
                                for dataset in found.datasets for feature in dataset.features
                                if (feature.path.step[0] if feature.path.step else feature.name) == schema.TEXT
                                for bucket in feature.string_stats.rank_histogram.buckets})


def render_markdown(card: ModelCard) -> str:
    """model_card.md: the card in words, under Mitchell et al.'s headings."""
    level = f"{card.confidence:.0%}"
    lines = [f"# Model card: {card.model_name} version {card.version}", "",
             "## Model details", "",
             f"Version {card.version} of `{card.model_name}`, pushed {card.pushed_at} from run `{card.run_id}`: "
             f"`{card.network}` at {card.image_size} px, exported for TF Serving (signature "
             f"`{schema.SERVING_SIGNATURE}`).", "",
             f"Environment: {card.environment.in_words() if card.environment else 'not recorded'}.", "",
             "## Intended use", "",
             f"Tells which of {len(card.labels)} classes an image (JPEG or PNG) shows: {', '.join(card.labels)}. "
             "It answers one of these for every image, also for an image of none of them.", "",
             "## Factors", "",
             "The class of the image: every figure below is given per class. Stoke records no other factor of "
             "the images (camera, place, time of day), so the model's accuracy across them is not known.", "",
             "## Metrics", "",
             f"Accuracy on the eval records, with Wilson's {level} interval; top-{card.top_k} accuracy; against "
             "the version it replaced, the paired difference on the same records with its interval and McNemar's "
             "exact p-value, as the gate decided by them.", "",
             "## Evaluation data", "",
             f"{card.example_count:,} eval records of span{'s' if len(card.spans) > 1 else ''} "
             f"{', '.join(str(s.span) for s in card.spans)} (the eval "
             "split ingest set aside by content: no picture is in both splits).", "",
             "## Training data", "",
             "| span | created | train | eval | data check | source |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {s.span} | {s.created} | {s.train:,} | {s.eval:,} | {s.data_check or 'not recorded'} | `{s.source}` |"
              for s in card.spans]
    lines += [""] + [f"- span {s.span}, data check: {warning}" for s in card.spans for warning in s.warnings]
    lines += ["", "## Quantitative analyses", "",
              f"Accuracy {card.accuracy:.4f} ({card.accuracy_interval[0]:.4f} to {card.accuracy_interval[1]:.4f}); "
              f"top-{card.top_k} {card.top_k_accuracy:.4f}; {card.example_count:,} eval records.", "",
              f"| class | train records | eval records | right | accuracy | {level} interval | replaced version | gate |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in card.classes:
        lines.append(f"| {c.label} | {_figure(c.train_records)} | {c.eval_records} | {c.right} | {_figure(c.accuracy)} | "
                     + (f"{c.interval[0]:.2f} to {c.interval[1]:.2f}" if c.interval else "-")
                     + f" | {_figure(c.baseline_accuracy)} | {c.verdict or '-'} |")
    lines.append("")
    evidence = card.evidence
    if evidence is not None:
        lines += [f"Against version {evidence.version}, on {evidence.example_count:,} records both were asked: "
                  f"{evidence.accuracy:.4f} against {evidence.baseline_accuracy:.4f}, a difference of "
                  f"{evidence.difference:+.4f} ({evidence.confidence:.0%} interval {evidence.interval[0]:+.4f} to "
                  f"{evidence.interval[1]:+.4f}, p = {evidence.p_value:.3g}, {evidence.method}).", ""]
    else:
        lines += ["No version was served before it: the gate held it to its accuracy floor alone.", ""]
    lines += [f"- gate: {note}" for note in card.gate_notes] + ([""] if card.gate_notes else [])
    lines += ["## Caveats and recommendations", ""]
    lines += [f"- {limit}" for limit in card.limitations] or ["Nothing known beyond the figures above."]
    return "\n".join(lines).rstrip() + "\n"


def _figure(value) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else f"{value:,}"
