"""The data check on spans the real Beam ingest published from real digit images: a shift of the label
mix warns, however large; a label no span let in had quarantines the span, training and the gate leave it
out, and `stoke spans release N` lets it in."""
import json
import os
import shutil

import pytest
from tensorflow_metadata.proto.v0 import statistics_pb2

from beam_jobs.ingest import run as ingest
from components.common.files import exists, read_result
from components.common.spans import SpanNotChecked, Spans
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig
from components.contracts.summaries import DataCheckRecord
from components.datacheck import datacheck, span_status
from components.train import trainer
from flows.demo import NAMES, write_digits

IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
SHORT_TRAINING = ["--preset", "demo", "--epochs", "1", "--steps-per-epoch", "2", "--input-probe-steps", "0",
                  "--trace-steps", "none", "--batch-size", "8"]


def last_json(code, capsys, expected=0) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    assert code == expected, out[-1:]
    return json.loads(out[-1])


def add_digits(pool, source, name: str, count: int, start: int, folder: str | None = None):
    """Copies `count` digits of class `name`, from digit number `start` on, into the source folder (into
    `folder`, a label of its own, if given)."""
    files = sorted(p for p in (pool / name).iterdir() if int(p.stem.split("-")[1]) >= start)[:count]
    (source / (folder or name)).mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy(path, source / (folder or name) / path.name)


# Span 1: the first 100 digits (every class about 10%); span 2: 4 each of four classes (a mild shift:
# 25% against about 10%); span 3: 12 ones and 4 twos (a large one: 60% ones), and 4 pictures of eights
# in a folder "ten", a label no span had.
ARRIVALS = {1: [(name, 100, 0) for name in NAMES],
            2: [(name, 4, 100) for name in ("zero", "two", "four", "six")],
            3: [("one", 12, 200), ("two", 4, 300), ("eight", 4, 400, "ten")]}


@pytest.fixture(scope="module")
def spans_root(tmp_path_factory):
    """Three spans ingested by the real Beam job, each checked as it arrived."""
    base = tmp_path_factory.mktemp("datacheck")
    pool, source, root = base / "pool", base / "source", str(base / "root")
    write_digits(str(pool), limit=500)
    checked = {}
    for number, arrival in ARRIVALS.items():
        for digits in arrival:
            add_digits(pool, source, *digits)
        if number == 1:  # the first 100 digits only
            for path in source.rglob("*.png"):
                if int(path.stem.split("-")[1]) >= 100:
                    path.unlink()
        # The digits are alike to dHash without being copies (docs/ingest.md#near-copies): following them
        # would move records between splits and blur the label mix this file checks.
        assert ingest([str(source), "--root", root, "--near-copies", "report", *IN_MEMORY]) == 0
        assert Spans(root).unchecked() == [number]  # published, and not read by training until checked
        (checked[number],) = datacheck.check_spans(RunConfig(root=root)).spans
    return root, checked


def spans_root_source(root):
    return Spans(root).manifests(checked=False)[0].source


def test_a_mild_shift_only_warns(spans_root):
    root, checked = spans_root
    summary = checked[2]
    assert summary.span == 2 and summary.status == "warning" and summary.history_spans == [1]
    assert [(a.kind, a.severity) for a in summary.anomalies if a.kind == "label_drift"] == [("label_drift", "warning")]
    assert 0.125 < summary.label_drift <= 0.25
    assert Spans(root).check_record(2).trusted
    assert checked[1].status in ("ok", "warning") and checked[1].label_drift is None


def test_a_new_label_quarantines_the_span_and_training_leaves_it_out(spans_root, capsys):
    root, checked = spans_root
    summary = checked[3]
    assert summary.status == "quarantined" and summary.label_drift > 0.45 and summary.history_spans == [1, 2]
    assert summary.label_counts == {"one": 12, "two": 4, "ten": 4}
    found = {a.kind: a for a in summary.anomalies}
    assert found["label_drift"].severity == "warning"  # 60% ones against about 10%: a skew alone trains
    assert (found["new_label"].severity, found["new_label"].count, found["new_label"].class_name) == ("error", 4, "ten")
    assert len(found["new_label"].examples) == 4 and all("/ten/" in uri for uri in found["new_label"].examples)
    record = read_result(Root(root).datacheck(3), DataCheckRecord)
    assert record.status == "quarantined" and record.reasons == [found["new_label"].message]
    assert {s.span for s in Spans(root).shards("train")} == {1, 2}
    assert {m.span for m in Spans(root).manifests(checked=False)} == {1, 2, 3}
    with pytest.raises(SpanNotChecked, match="stoke spans release 3"):
        Spans(root).shards("train", [3])
    # Still published for ingest: its files are known and it is no debris to clean up.
    assert ingest([str(spans_root_source(root)), "--root", root, *IN_MEMORY]) == 0
    assert not Spans(root).check_record(3).trusted and exists(Root(root).manifest(3))
    assert Spans(root).span_numbers() == [1, 2, 3]

    metrics = last_json(trainer.run(["--root", root, "--run-id", "held", *SHORT_TRAINING, "--json"]), capsys)
    assert metrics["spans"] == [1, 2]
    refused = last_json(trainer.run(["--root", root, "--spans", "3", *SHORT_TRAINING, "--json"]), capsys, 1)
    assert "stoke spans release 3" in refused["error"]


def test_release_lets_the_span_in_and_keeps_the_evidence(spans_root, capsys):
    root, _ = spans_root
    listed = last_json(span_status.run(["--root", root, "--json"]), capsys)["spans"]
    assert [(s["span"], s["status"]) for s in listed] == [(1, "ok"), (2, "warning"), (3, "quarantined")]
    assert "label 'ten' is new" in listed[2]["reason"]

    released = last_json(span_status.run(["release", "3", "--root", root, "--by", "ana", "--json"]), capsys)["released"]
    assert (released["status"], released["released_by"]) == ("released", "ana")
    record = read_result(Root(root).datacheck(3), DataCheckRecord)
    assert (record.status, record.released_by) == ("released", "ana")
    assert record.anomalies and "label 'ten' is new" in record.reasons[0]  # the evidence stays beside the release
    assert {s.span for s in Spans(root).shards("train")} == {1, 2, 3}
    again = last_json(span_status.run(["release", "3", "--root", root, "--json"]), capsys, 1)
    assert "released already, by ana" in again["error"]
    # Checking a released span again reports its anomalies and holds nothing back.
    (rechecked,) = datacheck.check_spans(RunConfig(root=root), span=3).spans
    assert rechecked.status == "released" and rechecked.anomalies and Spans(root).check_record(3).trusted


def another_spans_statistics(root, number, split):
    """Span 1's statistics of `split` (100 digits, never span `number`'s count)."""
    with open(Root(root).statistics(1, split), "rb") as f:
        return f.read()


def two_datasets(root, number, split):
    """A DatasetFeatureStatisticsList with one dataset per split, as the old statistics.pb held them."""
    both = statistics_pb2.DatasetFeatureStatisticsList()
    for name in ("train", "eval"):
        with open(Root(root).statistics(number, name), "rb") as f:
            both.datasets.add().CopyFrom(statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read()).datasets[0])
    return both.SerializeToString()


DAMAGE = {  # what is found in a statistics file -> what the one-line error says
    "missing": (None, "has no statistics"),
    "garbage": (lambda *_: b"\xff\xff\xff\xff", "is no DatasetFeatureStatisticsList"),
    "empty": (lambda *_: b"", "counts no records"),
    "two datasets": (two_datasets, "] records where span 2's manifest counts"),  # a list of two counts
    "another span's": (another_spans_statistics, "records where span 2's manifest counts"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("where", ["the span", "its history"])
def test_statistics_that_do_not_describe_the_span_stop_the_check_with_one_line(spans_root, tmp_path, capsys,
                                                                                damage, where):
    """Ingest writes the statistics before the manifest: a published span whose statistics are gone,
    unreadable or another's was changed afterwards, and is neither checked nor compared against."""
    root = str(tmp_path / "root")
    shutil.copytree(spans_root[0], root)
    make, message = DAMAGE[damage]
    split = "train"
    target = Root(root).statistics(2, split)
    data = make(root, 2, split) if make else None
    os.remove(target) if data is None else open(target, "wb").write(data)
    if where == "its history":  # span 3 is judged against no less than its history: the check stops
        out = last_json(datacheck.run(["--root", root, "--span", "3", "--json"]), capsys, expected=1)
        assert message in out["error"] and target in out["error"] and "restore its folder" in out["error"]
        assert "\n" not in out["error"] and Spans(root).check_record(2).trusted
    else:  # fail closed: the span is quarantined, its record says why
        out = last_json(datacheck.run(["--root", root, "--span", "2", "--json"]), capsys)
        (anomaly,) = read_result(Root(root).datacheck(2), DataCheckRecord).anomalies
        assert anomaly.kind == "no_statistics" and message in anomaly.message and target in anomaly.message
        assert not Spans(root).check_record(2).trusted
