"""`python -m components.datacheck --root ROOT [--span N]`: published spans against the history.

Checks every published span that has no valid data-check record yet (a new span, one published by
hand with `stoke ingest`, one whose run died before its check), oldest first; or, with --span, that
span again. Each span's statistics (statistics/Split-<split>/FeatureStats.pb, as TFX lays
them out), manifest and content index are compared with the statistics of
the spans the check has let in (the history) by check.py, and the verdict is written as the span's
record, _DATACHECK.json: ok or warning let training and the gate read it, an error quarantines it
until `stoke spans release N`. A released span checked again stays released. A span that cannot be
checked (statistics missing, unreadable or not counting what its manifest counts: ingest writes
them before the manifest, so the span was changed after it was published) is quarantined too: fail
closed, with a release for the person who looked. A history span whose statistics are so damaged stops
the check with a line naming the file.
When a model is served (ROOT/models/<model_name>) and was not trained on the span, its predictions on
the span's records are out-of-sample, and the label check (label_errors.py) flags the records whose
label it confidently contradicts; without one, the record and the summary say the label check was skipped.
"""
from __future__ import annotations

import time
from collections import defaultdict

from google.protobuf.message import DecodeError
from tensorflow_metadata.proto.v0 import statistics_pb2

from components.common import clock, program
from components.common import plots as draw
from components.common.content_index import parse
from components.common.files import filesystem, write_json
from components.common.spans import Spans
from components.common.store_errors import on_root
from components.common.trusted_index import verified
from components.contracts import schema, summaries
from components.contracts.label_check import LabelCheck
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.run_config import RunConfig
from components.contracts.summaries import (
    DATACHECK_VERSION,
    DataAnomaly,
    DataCheckRecord,
    DataCheckSummary,
    SpanCheck,
)
from components.datacheck import predictions
from components.datacheck.check import EXAMPLES, Verdict, decide, profile
from components.datacheck.label_errors import judge
from components.datacheck.mix import released_gone

SHEET = 32  # suspected label errors drawn on the span's sheet, most confident first


class DataCheckError(Exception):
    """A span that cannot be checked; the message says why."""


CHANGED = "ingest writes a span's statistics before its manifest, so the span was changed after it was published; " \
          "restore its folder from a backup"


def run(argv: list[str] | None = None) -> int:
    args = program.stage_arguments("datacheck", argv)
    return program.main("stoke datacheck", args.json,
                        on_root(lambda config, facts: check_spans(config, span=facts.span),
                                lambda: program.stage_config("datacheck", args)),
                        describe, errors=(DataCheckError, predictions.UnreadableSpan, ResultError, OSError))


def check_spans(config: RunConfig, *, span: int | None = None) -> DataCheckSummary:
    """Checks the span asked for, or every published span without a valid record, and records each verdict."""
    root = Root(config.root)
    published = {m.span: m for m in Spans(root).each_manifest(checked=False, sources=False)}
    if not published:
        return DataCheckSummary(message=f"no published span under {root.spans} to check", root=config.root)
    if span is not None and span not in published:
        raise DataCheckError(f"span {span} is not published under {root.spans}")
    numbers = [span] if span is not None else \
        [n for n, manifest in published.items() if Spans(root).check_record(n, manifest.sha256).record is None]
    if not numbers:
        return DataCheckSummary(message=f"every published span under {root.spans} is checked already", root=config.root)
    return DataCheckSummary(spans=[check_span(root, published, n, config) for n in numbers], root=config.root)


def check_span(root: Root, published: dict[int, SpanManifest], number: int, config: RunConfig) -> SpanCheck:
    """One span against the spans the check lets in now; its record written. Statistics that do not
    describe the span quarantine it; a history span's stop the check, for no span is judged against less."""
    manifest = published[number]
    let_in = {n: read.record for n, m in published.items()
              if n != number and (read := Spans(root).check_record(n, m.sha256)).trusted}
    history = list(let_in)
    past = {n: profile(read_statistics(root, published[n])) for n in history}
    try:
        hashes, examples = content(root, number, dhashes=manifest.same_picture is None)
        verdict = decide(number, profile(read_statistics(root, manifest)), past, config.datacheck, classes=manifest.labels,
                         conflicts=manifest.anomalies or [], same_picture=manifest.same_picture, dhashes=hashes,
                         quality=manifest.quality, examples=examples, gone=released_gone(let_in))
    except DataCheckError as error:
        missing = DataAnomaly(kind="no_statistics", severity="error", message=f"{error}; or release the span after a look")
        verdict = Verdict([missing], {}, {}, None)
    verdict.anomalies += changed_manifest(manifest)
    found, labels = check_labels(root, manifest, config.model_name,
                                 [r.label_check for r in let_in.values() if r.label_check])
    verdict.anomalies += found
    status = record(root, manifest, verdict, labels)
    return SpanCheck(span=number, status=status, anomalies=verdict.anomalies, history_spans=history,
                     label_counts=verdict.label_counts, history_label_counts=verdict.history_label_counts or None,
                     label_drift=None if verdict.label_drift is None else round(verdict.label_drift, 4),
                     record_uri=root.datacheck(number), label_check=labels)


def check_labels(root: Root, manifest: SpanManifest, model_name: str, past: list[LabelCheck]) -> tuple[list, LabelCheck]:
    """The label check of the span with the served model, or why it was skipped; the first flagged images
    drawn beside the record. Its history, `past`, is the label checks of the other spans the check let in."""
    started = time.monotonic()
    model = predictions.served(root, model_name, manifest)
    if isinstance(model, str):
        return [], LabelCheck(status="skipped", reason=model)
    try:
        found, images, _ = predictions.predict(root, manifest, model)
    except predictions.UnusableModel as error:  # the other checks still judge the span
        return [], LabelCheck(status="skipped", reason=str(error))
    findings, check = judge(found, past, model.error, model.uri)
    rows = {file: row for row, file in enumerate(found.files)}
    drawn = [(images[rows[f.file]], f"{f.label.given} -> {f.label.predicted} {f.label.confidence:.0%}")
             for f in findings if f.file is not None and rows[f.file] in images][:SHEET]
    if drawn:
        draw.image_sheet(drawn, root.label_errors_sheet(manifest.span))
        check.sheet = root.label_errors_sheet(manifest.span)
    check.seconds = round(time.monotonic() - started, 3)
    return findings, check


def record(root: Root, manifest: SpanManifest, verdict: Verdict, labels: LabelCheck) -> str:
    """Writes the span's record, naming the manifest judged; errors quarantine it, unless a valid record of the
    same manifest says someone released it. Its reasons are the errors about the span as a whole (a finding
    about one file is among the anomalies)."""
    number = manifest.span
    errors = [a for a in verdict.anomalies if a.severity == "error" and a.file is None]
    earlier = Spans(root).check_record(number, manifest.sha256).record
    status = summaries.verdict(verdict.anomalies)
    kept = {}
    if earlier is not None and earlier.status == "released":
        status, kept = "released", {"released_by": earlier.released_by, "released_at": earlier.released_at,
                                    "reasons": earlier.reasons}
    write_json(root.datacheck(number), DataCheckRecord.model_validate({
        "span": number, "check_version": DATACHECK_VERSION, "status": status, "checked_at": clock.now(),
        "reasons": [e.message for e in errors], "anomalies": verdict.anomalies, "label_check": labels,
        "manifest_sha256": manifest.sha256, **kept,
    }).to_json())
    return status


def changed_manifest(manifest: SpanManifest) -> list[DataAnomaly]:
    """An error when the manifest's shards do not hold what it counts, or name a file twice: ingest writes
    them together, so the manifest was edited after the span was published (a shard dropped from it, say)."""
    files = [entry.file for entry in manifest.shards]
    problems = [f"names {name} twice" for name in sorted({f for f in files if files.count(f) > 1})]
    for split in schema.SPLITS:
        held, counted = sum(e.records for e in manifest.shards if e.split == split), getattr(manifest.counts, split)
        if held != counted:
            problems.append(f"lists {split} shards of {held} records where it counts {counted} {split} records")
    if not problems:
        return []
    return [DataAnomaly(kind="span_changed", severity="error",
                        message=f"span {manifest.span}'s manifest {'; '.join(problems)}: it was changed after the span "
                                "was published; restore the span's folder from a backup, or release it after a look")]


def read_statistics(root: Root, manifest: SpanManifest) -> dict[str, statistics_pb2.DatasetFeatureStatisticsList]:
    """Split -> the span's statistics of it, each checked: one dataset, as many records as the manifest counts."""
    found = {}
    for split in schema.SPLITS:
        uri = root.statistics(manifest.span, split)
        fs, path = filesystem(uri)
        statistics = statistics_pb2.DatasetFeatureStatisticsList()
        try:
            statistics.ParseFromString(fs.cat_file(path))
        except FileNotFoundError:
            raise DataCheckError(f"span {manifest.span} has no statistics {uri}: {CHANGED}") from None
        except DecodeError:
            raise DataCheckError(f"{uri} is no DatasetFeatureStatisticsList: {CHANGED}") from None
        counted, records = [d.num_examples for d in statistics.datasets], getattr(manifest.counts, split)
        if counted != [records]:
            raise DataCheckError(f"{uri} counts {counted or 'no'} records where span {manifest.span}'s manifest counts "
                                 f"{records} {split} records: {CHANGED}")
        found[split] = statistics
    return found


def content(root: Root, number: int, *, dhashes: bool = True) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """dHash -> URIs of the span's records (when `dhashes`: a span whose manifest does not say which files are
    one picture), and label -> the first URIs of its records, from its content index: checked as it streams,
    rebuilt from the span's shards where missing or broken (components/common/trusted_index.py)."""
    def scan(lines) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        hashes, labels = defaultdict(list), defaultdict(list)
        for line in lines(number):
            _, dhash, _, label, uri = parse(line)
            if dhashes:
                hashes[dhash].append(uri)
            if len(labels[label]) < EXAMPLES:
                labels[label].append(uri)
        return dict(hashes), dict(labels)

    return verified(root, scan)


describe = program.lines_of(summaries.DataCheckSummary)
