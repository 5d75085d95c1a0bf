"""The data check's markers are read through their records: a release marker that is no valid release
lets nothing in, a quarantine marker that is no valid record still holds its span, and either is named
while `stoke spans` goes on listing every other span."""
from __future__ import annotations

import json
import os

import pytest

from components.contracts.layout import Root
from components.contracts.summaries import DataAnomaly, Quarantine, Release
from components.datacheck import datacheck, spans
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span

ERRORS = [DataAnomaly(kind="label_drift", severity="error", message="the label mix moved")]


def _quarantine(span: int) -> Quarantine:
    return Quarantine(span=span, reasons=["the label mix moved"], anomalies=ERRORS, quarantined_at="2026-01-01T00:00:00Z")


BAD = {  # what a marker may hold instead of its record
    "not JSON": b"{garbage",
    "empty": b"",
    "not UTF-8": b"\xff\xfe{}",
    "an empty object": b"{}",
    "a list": b"[1, 2]",
    "a folder": None,
}


def _plant(path: str, kind: str) -> None:
    if os.path.isdir(path):
        os.rmdir(path)
    elif os.path.exists(path):
        os.remove(path)
    if kind == "a folder":
        os.makedirs(path)
        return
    data = BAD.get(kind)
    if kind == "another span's":
        record = _quarantine(7) if path.endswith("_QUARANTINE.json") else Release(
            span=7, released_by="mallory", released_at="2026-01-01T00:00:00Z", quarantine=_quarantine(7))
        data = json.dumps(record.to_json()).encode()
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture
def root(tmp_path_factory, request):
    """Three published spans, span 3 quarantined by a valid record."""
    path = str(tmp_path_factory.mktemp("markers"))
    for number in (1, 2, 3):
        write_span(path, number, {"train": tiny_records(4, offset=10 * number)}, TRAIN_LABELS, {"train": 1})
    _quarantine(3).write(Root(path).quarantine(3))
    return Root(path)


def _listed(root: Root, capsys) -> dict:
    assert spans.run(["--root", root.uri, "--json"]) == 0, capsys.readouterr().err
    return {row["span"]: row for row in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["spans"]}


@pytest.mark.parametrize("kind", [*BAD, "another span's"])
def test_a_bad_release_marker_is_no_release(root, kind, capsys):
    _plant(root.released(1), kind)
    assert datacheck.hold_back(root, 1, ERRORS) == "quarantined"  # the data check still holds the span back
    assert Quarantine.read(root.quarantine(1)).reasons == ["the label mix moved"]
    assert 1 not in {s.span for s in root.shards("train")}
    row = _listed(root, capsys)[1]
    assert row["status"] == "quarantined" and "_RELEASED.json" in row["reason"] and "not a release" in row["reason"]


@pytest.mark.parametrize("kind", [*BAD, "another span's"])
def test_a_bad_quarantine_marker_holds_its_span_and_the_listing_goes_on(root, kind, capsys):
    _plant(root.quarantine(2), kind)
    assert {s.span for s in root.shards("train")} == {1}  # fail closed: span 2 stays out of training
    rows = _listed(root, capsys)
    assert [(n, r["status"]) for n, r in rows.items()] == [(1, "ok"), (2, "quarantined"), (3, "quarantined")]
    assert "_QUARANTINE.json" in rows[2]["reason"] and "held back" in rows[2]["reason"] and "\n" not in rows[2]["reason"]
    assert rows[3]["reason"] == "the label mix moved"

    assert spans.run(["release", "3", "--root", root.uri, "--json"]) == 0  # another span is released as ever
    assert spans.run(["release", "2", "--root", root.uri, "--by", "ana", "--json"]) == 0  # and this one, after a look
    capsys.readouterr()
    record = Release.read(root.released(2))
    assert record.released_by == "ana" and "_QUARANTINE.json" in record.quarantine.reasons[0]
    assert {s.span for s in root.shards("train")} == {1, 2, 3}


def test_the_data_check_replaces_a_bad_quarantine_marker_and_names_a_bad_release(root):
    _plant(root.quarantine(2), "not JSON")
    assert datacheck.hold_back(root, 2, ERRORS) == "quarantined"
    assert Quarantine.read(root.quarantine(2)).span == 2  # a record now, and the span was held throughout
    _plant(root.released(1), "not JSON")
    assert "_RELEASED.json" in "; ".join(root.markers(1).problems)


def test_releasing_a_span_whose_release_marker_is_bad_says_so_in_one_line(root, capsys):
    os.remove(root.quarantine(3))
    _plant(root.released(3), "not JSON")
    assert spans.run(["release", "3", "--root", root.uri, "--json"]) == 1
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert "span 3 is not quarantined" in error and "_RELEASED.json is not JSON" in error and "\n" not in error
    row = _listed(root, capsys)[3]
    assert row["status"] == "ok" and "not a release" in row["reason"]
