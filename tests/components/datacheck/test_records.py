"""Fail closed: training and the gate read a span only when its data-check record is a valid one of
that span and lets it in. A span published by hand, one whose check never ran, and one whose record is
damaged or another span's are left out, named, listed by `stoke spans`, and checked by the next data check."""
from __future__ import annotations

import json
import os

import pytest

from components.common.files import read_result, write_json
from components.common.spans import SpanNotChecked, Spans
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig
from components.contracts.summaries import DATACHECK_VERSION, DataAnomaly, DataCheckRecord
from components.datacheck import datacheck, span_status
from tests.components.conftest import TRAIN_LABELS, let_in, tiny_records, write_span

ERRORS = [DataAnomaly(kind="label_drift", severity="error", message="the label mix moved")]

BAD = {  # what a record may hold instead of itself
    "not JSON": b"{garbage",
    "empty": b"",
    "not UTF-8": b"\xff\xfe{}",
    "an empty object": b"{}",
    "a list": b"[1, 2]",
    "an unknown status": json.dumps({"span": 2, "check_version": 1, "status": "fine", "checked_at": "x",
                                     "reasons": [], "anomalies": []}).encode(),
    "another span's": json.dumps({"span": 7, "check_version": 1, "status": "ok", "checked_at": "x",
                                  "reasons": [], "anomalies": []}).encode(),
    "a folder": None,
}


def quarantined(root: Root, span: int) -> DataCheckRecord:
    return DataCheckRecord(span=span, check_version=DATACHECK_VERSION, status="quarantined", checked_at="2026-01-01T00:00:00Z",
                           reasons=["the label mix moved"], anomalies=ERRORS, manifest_sha256=Spans(root).manifest_sha256(span))


def plant(path: str, kind: str) -> None:
    os.remove(path) if os.path.exists(path) else None
    if kind == "a folder":
        os.makedirs(path)
        return
    with open(path, "wb") as f:
        f.write(BAD[kind])


@pytest.fixture
def root(tmp_path):
    """Three published spans: 1 let in, 2 let in, 3 quarantined."""
    for number in (1, 2, 3):
        write_span(str(tmp_path), number, {"train": tiny_records(4, offset=10 * number)}, TRAIN_LABELS, {"train": 1})
    write_json(Root(str(tmp_path)).datacheck(3), quarantined(Root(str(tmp_path)), 3).to_json())
    return Root(str(tmp_path))


def listed(root: Root, capsys) -> dict:
    assert span_status.run(["--root", root.uri, "--json"]) == 0, capsys.readouterr().err
    return {row["span"]: row for row in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["spans"]}


def test_a_span_published_without_a_check_is_never_read(tmp_path, capsys):
    write_span(str(tmp_path), 1, {"train": tiny_records(4)}, TRAIN_LABELS, {"train": 1}, checked=False)
    root = Root(str(tmp_path))
    assert Spans(root).shards("train") == [] and Spans(root).unchecked() == [1]
    with pytest.raises(SpanNotChecked, match=r"span 1 has not been data-checked; check it with `stoke datacheck"):
        Spans(root).shards("train", [1])
    row = listed(root, capsys)[1]
    assert row["status"] == "unchecked" and "training leaves it out" in row["reason"]
    let_in(str(tmp_path), 1)
    assert [s.span for s in Spans(root).shards("train")] == [1]


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_record_lets_nothing_in_is_named_and_the_listing_goes_on(root, kind, capsys):
    plant(root.datacheck(2), kind)
    assert {s.span for s in Spans(root).shards("train")} == {1}  # fail closed: span 2 stays out of training
    with pytest.raises(SpanNotChecked, match=r"span 2 has no valid data-check record \(.*_DATACHECK.json"):
        Spans(root).shards("train", [2])
    rows = listed(root, capsys)
    assert [(n, r["status"]) for n, r in rows.items()] == [(1, "ok"), (2, "unchecked"), (3, "quarantined")]
    assert "_DATACHECK.json" in rows[2]["reason"] and "\n" not in rows[2]["reason"]
    assert rows[3]["reason"] == "the label mix moved"
    assert Spans(root).unchecked() == [2]  # the next data check judges it again


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_span_with_a_bad_record_cannot_be_released_only_checked(root, kind, capsys):
    plant(root.datacheck(2), kind)
    assert span_status.run(["release", "2", "--root", root.uri, "--json"]) == 1
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert "check it again with `stoke datacheck" in error and "\n" not in error
    assert span_status.run(["release", "3", "--root", root.uri, "--by", "ana", "--json"]) == 0  # the others as ever
    capsys.readouterr()
    assert {s.span for s in Spans(root).shards("train")} == {1, 3}


def test_releasing_keeps_the_evidence_in_one_record(root, capsys):
    assert span_status.run(["release", "3", "--root", root.uri, "--by", "ana", "--json"]) == 0
    capsys.readouterr()
    record = read_result(root.datacheck(3), DataCheckRecord)
    assert (record.status, record.released_by, record.reasons, record.anomalies) == (
        "released", "ana", ["the label mix moved"], ERRORS)
    assert span_status.run(["release", "1", "--root", root.uri, "--json"]) == 1  # a span it found fine is no release
    assert "not quarantined (the data check found it ok)" in capsys.readouterr().out


def test_a_span_without_statistics_is_quarantined_not_trusted(tmp_path):
    write_span(str(tmp_path), 1, {"train": tiny_records(4)}, TRAIN_LABELS, {"train": 1}, checked=False)
    (check,) = datacheck.check_spans(RunConfig(root=str(tmp_path))).spans
    assert check.status == "quarantined" and [a.kind for a in check.anomalies] == ["no_statistics"]
    assert Spans(str(tmp_path)).shards("train") == []


def _edit_json(path: str, change) -> None:
    data = json.loads(open(path).read())
    change(data)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("edit", ["a shard dropped", "a count changed", "one byte"])
def test_a_record_binds_the_manifest_it_judged(root, edit, capsys):
    """The record names its manifest's SHA-256: a manifest edited since (a shard dropped from it, say) makes
    the record no valid one, so training and the gate leave the span out and the next data check judges it."""
    manifest = root.manifest(2)
    if edit == "a shard dropped":
        _edit_json(manifest, lambda m: m.update(shards=[]))
    elif edit == "a count changed":
        _edit_json(manifest, lambda m: m["counts"].update(train=3))
    else:
        with open(manifest, "ab") as f:
            f.write(b" ")
    assert {s.span for s in Spans(root).shards("train")} == {1}
    with pytest.raises(SpanNotChecked, match=r"span 2 has no valid data-check record \(.*made for another "
                                             r"_MANIFEST.json than the span's.*restore the manifest"):
        Spans(root).shards("train", [2])
    rows = listed(root, capsys)
    assert rows[2]["status"] == "unchecked" and "made for another _MANIFEST.json" in rows[2]["reason"]
    assert Spans(root).unchecked() == [2]


def test_a_manifest_that_dropped_a_shard_is_quarantined_when_checked_again(root):
    """Checked again, a manifest whose shards no longer hold what it counts is a span changed after publishing:
    quarantined, not let in on half its data."""
    _edit_json(root.manifest(2), lambda m: m.update(shards=[]))
    (check,) = datacheck.check_spans(RunConfig(root=root.uri)).spans
    assert check.span == 2 and check.status == "quarantined"
    assert [a.kind for a in check.anomalies if a.severity == "error"] == ["span_changed"]
    assert "lists train shards of 0 records where it counts 4" in check.anomalies[-1].message
    assert {s.span for s in Spans(root).shards("train")} == {1}


@pytest.mark.parametrize("status", ["ok", "warning", "released"])
def test_a_status_edited_by_hand_lets_nothing_in(root, status, capsys):
    """A quarantined span whose record was edited to let it in: its status no longer follows from its own
    anomalies (or names no one who released it), so it is no valid record at all."""
    _edit_json(root.datacheck(3), lambda r: r.update(status=status))
    assert {s.span for s in Spans(root).shards("train")} == {1, 2}
    with pytest.raises(SpanNotChecked, match="span 3 has no valid data-check record"):
        Spans(root).shards("train", [3])
    row = listed(root, capsys)[3]
    assert row["status"] == "unchecked"
    assert ("who released" if status == "released" else f"status '{status}' where its anomalies make it "
            "'quarantined'") in row["reason"]


def test_a_record_moved_to_another_span_is_not_that_spans(root):
    """Span 1's record given span 2's number: it names span 1's manifest, not span 2's."""
    record = json.loads(open(root.datacheck(1)).read())
    with open(root.datacheck(2), "w") as f:
        json.dump({**record, "span": 2}, f)
    assert {s.span for s in Spans(root).shards("train")} == {1}
    assert "made for another _MANIFEST.json" in Spans(root).check_record(2).problem


def test_a_record_made_before_records_named_their_manifest_is_checked_again_by_the_next_check(root):
    """Records of before read as unchecked, and the next data check (the flow runs it before training) judges
    those spans again on their statistics and content index, oldest first, and records the manifests."""
    for number in (1, 2, 3):
        _edit_json(root.datacheck(number), lambda r: r.pop("manifest_sha256"))
    assert Spans(root).shards("train") == [] and Spans(root).unchecked() == [1, 2, 3]
    assert "made before check records named the manifest" in Spans(root).check_record(1).problem
    summary = datacheck.check_spans(RunConfig(root=root.uri))
    assert [(c.span, c.history_spans) for c in summary.spans] == [(1, []), (2, [1]), (3, [1, 2])]
    assert all(c.label_check.status == "skipped" for c in summary.spans)  # no served model: no predictions
    assert Spans(root).unchecked() == [] and {s.span for s in Spans(root).shards("train")} == {1, 2, 3}
    assert read_result(root.datacheck(2), DataCheckRecord).manifest_sha256 == Spans(root).manifest_sha256(2)


def test_the_listing_says_which_spans_changed_after_publishing(root, capsys):
    """`stoke spans` checks shards as training does: a span whose shard was rewritten is listed as changed, with
    the shard and what to do, whatever its record says."""
    from tests.components.conftest import relabel

    shard = Spans(root).shards("train", [2])[0].uri
    relabel(shard, 0)
    rows = listed(root, capsys)
    assert [(n, r["status"]) for n, r in rows.items()] == [(1, "ok"), (2, "changed"), (3, "quarantined")]
    assert rows[2]["reason"].startswith(f"span 2 changed after it was published: {shard} ")
    assert "  changed  " in span_status.describe({"spans": list(rows.values())}).splitlines()[2]
