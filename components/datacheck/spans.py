"""`stoke spans --root ROOT`: every published span with its status (ok, quarantined, released) and counts.
`stoke spans release N --root ROOT`: lets a quarantined span in, after someone looked at it.

A release never deletes the evidence: the quarantine record moves into the release record
(_RELEASED.json, with who and when), written before the marker goes, so a crash in between leaves
the span still quarantined and the release can simply run again.
"""
from __future__ import annotations

import getpass
import socket
import sys

from components.common import clock
from components.common.files import exists, remove
from components.contracts import program
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.summaries import Quarantine, Release, SpansSummary, SpanStatus


class SpansError(Exception):
    pass


def status(root: Root, manifest: SpanManifest) -> SpanStatus:
    """The span's row; a marker that is no valid record is its reason (a bad quarantine still holds the span)."""
    number, counts = manifest.span, manifest.counts
    row = SpanStatus(span=number, status="ok", train=counts.train, eval=counts.eval, dead_letter=counts.dead_letter)
    markers = root.markers(number)
    if markers.held:
        row.status = "quarantined"
        row.reason = (markers.quarantine.reasons or [None])[0] if markers.quarantine else None
    elif markers.release:
        row.status, row.released_by = "released", markers.release.released_by
        row.reason = (markers.release.quarantine.reasons or [None])[0]
    if markers.problems:
        row.reason = "; ".join(markers.problems + ([row.reason] if row.reason else []))
    return row


def list_spans(root: Root) -> SpansSummary:
    return SpansSummary(spans=[status(root, m) for m in root.manifests(quarantined=True)])


def release(root: Root, number: int, by: str | None = None) -> SpansSummary:
    """Lets span `number` in: its quarantine record goes into _RELEASED.json with who and when."""
    if not exists(root.manifest(number)):
        raise SpansError(f"span {number} is not published under {root.spans}")
    markers = root.markers(number)
    if not markers.held:
        if markers.release:
            done = markers.release
            raise SpansError(f"span {number} was released already, by {done.released_by} at {done.released_at}")
        raise SpansError(f"span {number} is not quarantined" + "".join(f" ({p})" for p in markers.problems))
    # A quarantine marker that is no record still held the span: the release keeps why it could not be read.
    held = markers.quarantine or Quarantine(span=number, reasons=markers.problems[:1], anomalies=[], quarantined_at="")
    record = Release(span=number, released_by=by or f"{getpass.getuser()}@{socket.gethostname()}",
                     released_at=clock.now(), quarantine=held)
    record.write(root.released(number))
    remove(root.quarantine(number))
    return SpansSummary(released=status(root, SpanManifest.read(root.manifest(number))))


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
    return program.main("stoke spans", args.json, work, describe, errors=(SpansError, ResultError, OSError))


def describe(summary: dict) -> str:
    if summary.get("released"):
        return f"span {summary['released']['span']} released: training and the gate read it from now on"
    rows = [f"{'span':>6}  {'status':<11}  {'train':>7}  {'eval':>6}  {'dead':>6}  reason"]
    rows += [f"{r['span']:>6}  {r['status']:<11}  {r['train']:>7}  {r['eval']:>6}  {r['dead_letter']:>6}  "
             f"{r.get('reason') or ''}" for r in summary["spans"]]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(run())
