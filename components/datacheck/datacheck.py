"""`python -m components.datacheck --root ROOT [--span N]`: a new span against the published history.

Gathers the span's statistics (statistics/Split-<split>/FeatureStats.pb, as TFX lays them out),
manifest and content index and the statistics of the other published spans that are not quarantined
(the history), lets check.py decide, and on an error writes the span's quarantine marker: training and
the gate then leave the span out until `stoke spans release N`. A released span is checked again
without being held back a second time. Statistics that are missing, unreadable, or that do not count
the records the span's manifest counts stop the check with a line naming the file: ingest writes
them before the manifest, so such a span was changed after it was published.
"""
from __future__ import annotations

from collections import defaultdict

from google.protobuf.message import DecodeError
from tensorflow_metadata.proto.v0 import statistics_pb2

from components.common import clock
from components.common.content_index import parse
from components.common.files import filesystem
from components.common.trusted_index import verified
from components.contracts import program, schema
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.run_config import DataCheckSettings
from components.contracts.summaries import DataCheckSummary, Quarantine
from components.datacheck.check import decide, profile


class DataCheckError(Exception):
    """A span that cannot be checked; the message says why."""


CHANGED = "ingest writes a span's statistics before its manifest, so the span was changed after it was published; " \
          "restore its folder from a backup"


def run(argv: list[str] | None = None) -> int:
    args = program.stage_arguments("datacheck", argv)
    return program.main("stoke datacheck", args.json, lambda: check_span(program.stage_settings("datacheck", args)),
                        describe, errors=(DataCheckError, ResultError, OSError))


def check_span(config: DataCheckSettings) -> DataCheckSummary:
    root = Root(config.root)
    published = root.manifests(quarantined=True)
    if not published:
        return DataCheckSummary(checked=False, message=f"no published span under {root.spans} to check")
    number = config.span or published[-1].span
    manifest = next((m for m in published if m.span == number), None)
    if manifest is None:
        raise DataCheckError(f"span {number} is not published under {root.spans}")
    history = [m for m in published if m.span != number and not root.is_quarantined(m.span)]
    verdict = decide(number, profile(read_statistics(root, manifest)),
                     [profile(read_statistics(root, m)) for m in history], config,
                     classes=manifest.labels, conflicts=manifest.anomalies or [], dhashes=dhashes(root, number))
    summary = DataCheckSummary(
        checked=True, span=number, anomalies=verdict.anomalies, history_spans=[m.span for m in history],
        label_counts=verdict.label_counts, history_label_counts=verdict.history_label_counts,
        label_drift=None if verdict.label_drift is None else round(verdict.label_drift, 4),
        status="warning" if verdict.anomalies else "ok")
    if verdict.errors:
        summary.status = hold_back(root, number, verdict.errors)
        summary.quarantine_uri = root.quarantine(number) if summary.status == "quarantined" else None
    problems = root.markers(number).problems
    if problems:
        summary.message = "; ".join(problems)
    return summary


def hold_back(root: Root, number: int, errors) -> str:
    """Quarantines the span, unless a valid release record says someone let it in after looking. A
    quarantine marker that is no valid record (the span was held all along) is replaced by this one."""
    markers = root.markers(number)
    if markers.release:
        return "released"
    if markers.quarantine is None:
        Quarantine(span=number, reasons=[e.message for e in errors], anomalies=errors,
                   quarantined_at=clock.now()).write(root.quarantine(number))
    return "quarantined"


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


def dhashes(root: Root, number: int) -> dict[str, list[str]]:
    """dHash -> URIs of the span's records, from its content index: checked as it streams, rebuilt
    from the span's shards where missing or broken (components/common/trusted_index.py)."""
    def scan(lines) -> dict[str, list[str]]:
        found = defaultdict(list)
        for line in lines(number):
            _, dhash, _, _, uri = parse(line)
            found[dhash].append(uri)
        return dict(found)

    return verified(root, scan)


def describe(summary: dict) -> str:
    if not summary.get("checked"):
        return summary.get("message") or "not checked"
    lines = [f"span {summary['span']}: {summary['status']}"]
    lines += [f"{a['severity']}: {a['message']}" for a in summary.get("anomalies") or []]
    lines += [summary["message"]] if summary.get("message") else []
    if summary.get("status") == "quarantined":
        lines.append(f"held back from training; after a look: stoke spans release {summary['span']} --root ROOT")
    return "\n".join(lines)
