"""`stoke spans --root ROOT`: every published span with its data-check status (ok, warning,
quarantined, released, or unchecked: not read by training; or changed: its shards are not the files its
manifest names, which training and the gate refuse), counts, and the files its label check flagged as
suspected label errors (`labels?`; `-` where the label check did not run). Shards TensorFlow reads in
place (a local ROOT) are checked as training checks them: their size, and their SHA-256 once for each
file as it is (components/common/shard_digests.py); a bucket's are checked as they are copied.
`stoke spans release N --root ROOT`: lets a quarantined span in, after someone looked at it.

A release rewrites the span's record in one write: status released, who and when, and the reasons and
anomalies it let in kept beside them, so the evidence stays and a release interrupted halfway leaves the
span quarantined.
"""
from __future__ import annotations

import getpass
import socket
import sys
from collections import defaultdict

from components.common import clock, program, shard_digests
from components.common.cache_folder import CacheError
from components.common.files import exists, write_json
from components.common.shard_digests import Mismatch, changed_spans
from components.common.spans import Spans
from components.common.tf_files import tf_reads
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.schema import SPLITS
from components.contracts.summaries import SpansSummary, SpanStatus


class SpansError(Exception):
    pass


def status(root: Root, manifest: SpanManifest, mismatched: list[Mismatch] = ()) -> SpanStatus:
    """The span's row: its record's status, or unchecked (with why, when a record is there but is no valid one),
    or changed when some of its shards (`mismatched`) are not the files its manifest names."""
    number, counts = manifest.span, manifest.counts
    found = Spans(root).check_record(number, manifest.sha256)
    row = SpanStatus(span=number, status=found.record.status if found.record else "unchecked", train=counts.train,
                     eval=counts.eval, dead_letter=counts.dead_letter)
    if found.record is not None:
        row.reason = (found.record.reasons or [None])[0]
        row.released_by = found.record.released_by
        labels = found.record.label_check
        row.label_errors = len(found.record.suspected_label_errors()) if labels and labels.status == "done" else None
    else:
        row.reason = found.problem or "not checked yet: training leaves it out until `stoke datacheck` has"
    if mismatched:
        row.status, row.reason = "changed", changed_spans(list(mismatched))
    return row


def list_spans(root: Root) -> SpansSummary:
    manifests = Spans(root).manifests(checked=False)
    mismatched = defaultdict(list)
    if manifests and tf_reads(root.uri):
        shards = [s for split in SPLITS for s in Spans(root).shards(split, checked=False)]
        for found in shard_digests.check(shards).mismatched:
            mismatched[found.shard.span].append(found)
    return SpansSummary(spans=[status(root, m, mismatched[m.span]) for m in manifests])


def release(root: Root, number: int, by: str | None = None) -> SpansSummary:
    """Lets span `number` in: its record says released, by whom and when, and keeps what it let in."""
    if not exists(root.manifest(number)):
        raise SpansError(f"span {number} is not published under {root.spans}")
    found = Spans(root).check_record(number)
    if found.record is None or found.record.status != "quarantined":
        if found.record is not None and found.record.status == "released":
            raise SpansError(f"span {number} was released already, by {found.record.released_by} at "
                             f"{found.record.released_at}")
        why = found.refusal(root.uri) or f"span {number} is not quarantined (the data check found it {found.record.status})"
        raise SpansError(why)
    write_json(root.datacheck(number), found.record.model_copy(update={
        "status": "released", "released_by": by or f"{getpass.getuser()}@{socket.gethostname()}",
        "released_at": clock.now()}).to_json())
    return SpansSummary(released=status(root, Spans(root).read_manifest(number)))


def run(argv: list[str] | None = None) -> int:
    parser = program.arguments("stoke spans", __doc__)
    parser.add_argument("action", nargs="?", choices=["release"], help="release: let a quarantined span in")
    parser.add_argument("span", nargs="?", type=int, help="the span to release")
    parser.add_argument("--root", required=True, help="artifact ROOT: local path or fsspec URI")
    parser.add_argument("--by", default=None, help="who looked and released it (default: user@host)")
    args = parser.parse_args(argv)
    if args.action and args.span is None:
        parser.error("release needs the span's number: stoke spans release N --root ROOT")
    root = Root(args.root)
    work = (lambda: release(root, args.span, args.by)) if args.action else (lambda: list_spans(root))
    return program.main("stoke spans", args.json, work, describe, errors=(SpansError, ResultError, CacheError, OSError))


def describe(summary: dict) -> str:
    if summary.get("released"):
        return f"span {summary['released']['span']} released: training and the gate read it from now on"
    rows = [f"{'span':>6}  {'status':<11}  {'train':>7}  {'eval':>6}  {'dead':>6}  {'labels?':>7}  reason"]
    rows += [f"{r['span']:>6}  {r['status']:<11}  {r['train']:>7}  {r['eval']:>6}  {r['dead_letter']:>6}  "
             f"{'-' if r.get('label_errors') is None else r['label_errors']:>7}  {r.get('reason') or ''}"
             for r in summary["spans"]]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(run())
