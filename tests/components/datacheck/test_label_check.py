"""The label check with real parts: the colour model of the shared gate scenario (trained, gated and
pushed once per session), new spans of generated images with files in the wrong class folder, and the
real `stoke datacheck` program. A few mis-sorted files are flagged, named and warned about, and nothing
correctly labelled is; a folder filled with another class's images quarantines its span; without a
served model that may judge the span, the record and the summary say the label check was skipped."""
from __future__ import annotations

import io
import json
import os
import shutil
from contextlib import redirect_stdout

import numpy as np
import pytest
from PIL import Image

from beam_jobs.statistics import write_statistics
from components.common.files import read_json, read_result, write_json
from components.common.repository import Repository
from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig
from components.contracts.summaries import DataCheckRecord
from components.datacheck import datacheck, span_status
from components.report.report import write_report
from components.train.trainer import suspected_label_errors
from tests.components.conftest import TRAIN_LABELS, tiny_image, write_span
from tests.components.gate_runs import copy_root, gate_scenario

LABELS = [*TRAIN_LABELS, "yellow"]  # yellow: a class the served model does not know
SHARDS = {"train": 2, "eval": 1}


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


def unmistakable(colour: int, index: int) -> bytes:
    """A picture of `colour` the served model cannot doubt: the channel near full, the others near nothing."""
    rng = np.random.default_rng(index)
    pixels = rng.integers(0, 30, size=(32, 40, 3), dtype=np.uint8)
    pixels[..., colour] = rng.integers(230, 255, size=(32, 40), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def publish(root: str, number: int, rows: list[tuple[int, int]]) -> list[str]:
    """Span `number` with one record per (colour of the picture, label given), 48 train and the rest
    eval, and its statistics, as ingest publishes them; returns each record's source URI, in order.
    A picture in a folder not its colour's is unmistakable: confident learning flags what the model is
    sure of (how many it finds of those it is less sure of is benchmarks/label_errors.py's question)."""
    records = [((tiny_image if colour == label else unmistakable)(colour, 9000 + 100 * number + i), "jpeg", label)
               for i, (colour, label) in enumerate(rows)]
    splits = {"train": records[:48], "eval": records[48:]}
    write_span(root, number, splits, LABELS, SHARDS, checked=False)
    write_statistics(Root(root), number, [
        {"uri": f"{split}/{i}", "split": split, "label": LABELS[r[2]], "format": "jpeg", "bytes": len(r[0]),
         "mean": 100.0, "std": 20.0,
         "width": 40, "height": 32} for split, part in splits.items() for i, r in enumerate(part)], [], LABELS)
    uris = {}  # write_span deals each split's records round-robin over its shards
    for split, part in splits.items():
        for index in range(len(part)):
            uris[(split, index)] = f"mem://{split}/{index % SHARDS[split]}/{index // SHARDS[split]}"
    return [uris[("train", i)] if i < 48 else uris[("eval", i - 48)] for i in range(len(records))]


def check(*argv: str) -> tuple[int, dict]:
    """`stoke datacheck ARGV --json`: its exit code and summary."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = datacheck.run([*argv, "--json"])
    return code, json.loads(out.getvalue().strip().splitlines()[-1])


CLEAN = [(c, c) for c in range(3)] * 20  # 60 records, 20 of each colour, each in its own folder
MOVED = {3: 1, 10: 2, 20: 0, 49: 2}  # record -> the folder it was sorted into: three train, one eval


def test_files_in_the_wrong_folder_are_flagged_and_named_and_nothing_else_is(trained_runs, tmp_path, capsys):
    root = copy_root(trained_runs, tmp_path)
    # Span 2, let in: yellow, a label of the history the served model (trained on span 1) does not know.
    write_span(root, 2, {"train": [(tiny_image(0, 8000 + i), "jpeg", 3) for i in range(3)]}, LABELS, {"train": 1})
    rows = [(colour, MOVED.get(i, label)) for i, (colour, label) in enumerate(CLEAN)] + [(0, 3)] * 3
    uris = publish(root, 3, rows)
    code, summary = check("--root", root)
    assert code == 0
    (span,) = summary["spans"]
    labels = span["label_check"]
    assert (span["span"], span["status"]) == (3, "warning")
    assert (labels["status"], labels["checked"], labels["unknown"], labels["flagged"]) == ("done", 60, 3, 4)
    newest = os.path.basename(trained_runs["push"]["mixed"][1]["model_uri"])
    assert labels["model"] == os.path.join(root, "models", "stoke", newest)  # the newest version judged
    flagged = {a["file"]: a["label"] for a in span["anomalies"] if a.get("file")}
    assert set(flagged) == {uris[i] for i in MOVED}  # precision 1, recall 1 on this span
    assert {(f["given"], f["predicted"], f["split"]) for f in flagged.values()} == {
        ("green", "red", "train"), ("blue", "green", "train"), ("red", "blue", "train"), ("blue", "green", "eval")}
    assert all(f["confidence"] > 0.5 > f["given_probability"] for f in flagged.values())
    assert sorted((p["given"], p["predicted"], p["count"]) for p in labels["pairs"]) == [
        ("blue", "green", 2), ("green", "red", 1), ("red", "blue", 1)]
    (about_span,) = [a for a in span["anomalies"] if a["kind"] == "label_error" and not a.get("file")]
    assert about_span["severity"] == "warning" and about_span["count"] == 4 and "within chance" in about_span["message"]

    record = read_result(Root(root).datacheck(3), DataCheckRecord)  # the record holds the same findings
    assert record.label_check.flagged == 4 and {a.file for a in record.suspected_label_errors()} == set(flagged)
    assert record.reasons == [] and open(labels["sheet"], "rb").read(4) == b"\x89PNG"
    assert span_status.run(["--root", root, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["spans"]
    assert [(r["span"], r["label_errors"]) for r in rows] == [(1, None), (2, None), (3, 4)]

    config = RunConfig(source=root, root=root, train=TrainConfig(drop_suspected_label_errors=True))
    shards = Spans(root).shards("train")
    assert suspected_label_errors(config, shards) == tuple(sorted((3, uris[i]) for i in (3, 10, 20)))
    assert suspected_label_errors(RunConfig(source=root, root=root), shards) == ()  # the default trains on them

    run = Root(root).run("r1")
    write_json(run.result("datacheck"), summary)
    markdown = write_report(run)["markdown"]
    assert f"| `{uris[10]}` | train | blue | green |" in markdown and "| blue | green | 2 |" in markdown
    assert "![suspected label errors](label_errors.png)" in markdown and os.path.exists(run.label_errors_plot)


def test_a_folder_filled_with_another_class_quarantines_the_span(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    rows = [(c, 1 if c == 2 and i % 2 else c) for i, (c, _) in enumerate(CLEAN)]  # half the blue ones in green
    uris = publish(root, 2, rows)
    code, summary = check("--root", root)
    (span,) = summary["spans"]
    assert code == 0 and span["status"] == "quarantined"
    moved = {uris[i] for i, (c, label) in enumerate(rows) if c != label}
    flagged = {a["file"] for a in span["anomalies"] if a.get("file")}
    assert len(moved) == 10 and flagged == moved
    record = read_result(Root(root).datacheck(2), DataCheckRecord)
    assert "far above the expected 3.0%" in record.reasons[0] and "10 'green' -> 'blue'" in record.reasons[0]
    assert "10 of 30 records of class 'green'" in record.reasons[0]  # the test that decided: on the folder
    assert {s.span for s in Spans(root).shards("train")} == {1}  # held back from training


def test_a_skewed_arrival_trains_beside_a_relabelled_one_that_is_quarantined(trained_runs, tmp_path):
    """Two arrivals checked side by side: span 2 brings red and green and no blue (a skewed night, every file
    in its folder); span 3 brings all three, every blue picture in the green folder (a relabelled class)."""
    root = copy_root(trained_runs, tmp_path)
    publish(root, 2, [(0, 0), (1, 1)] * 30)
    relabelled = publish(root, 3, [(c, 1 if c == 2 else c) for c, _ in CLEAN])
    code, summary = check("--root", root)
    skewed, broken = summary["spans"]
    assert code == 0 and (skewed["span"], skewed["status"], broken["span"], broken["status"]) == (
        2, "warning", 3, "quarantined")
    found = {a["kind"]: a for a in skewed["anomalies"]}
    assert {a["severity"] for a in found.values()} == {"warning"} and skewed["label_check"]["flagged"] == 0
    assert found["absent_class"]["class_name"] == "blue" and "fewer 'blue' (0 where " in found["label_drift"]["message"]
    (reason,) = read_result(Root(root).datacheck(3), DataCheckRecord).reasons
    assert "far above the expected" in reason and "'green' -> 'blue'" in reason
    flagged = {a["file"] for a in broken["anomalies"] if a.get("file")}
    assert flagged <= {relabelled[i] for i, (c, _) in enumerate(CLEAN) if c == 2} and len(flagged) >= 19
    assert {s.span for s in Spans(root).shards("train")} == {1, 2}  # the skewed night trains, the relabel waits
    assert "held back from training" in datacheck.describe(summary)


# A served version damaged on disk: TensorFlow's loader raises what the damage makes of it (IndexError for
# variables cut short, DecodeError for a graph cut short, OpError for an index that is none).
DAMAGED = {"variables cut in half": ("variables", "variables.data-00000-of-00001"),
           "graph cut short": ("saved_model.pb",), "index not an index": ("variables", "variables.index")}


@pytest.mark.parametrize("case", ["other model name", "no lineage", "trained on it", *DAMAGED])
def test_without_a_model_that_may_judge_the_span_the_label_check_says_it_was_skipped(trained_runs, tmp_path, case):
    root = copy_root(trained_runs, tmp_path)
    publish(root, 2, CLEAN)
    argv, why = ["--root", root], {"other model name": "no served model", "no lineage": "has no lineage",
                                   "trained on it": "was trained on span 1"}.get(case, "cannot be loaded")
    if case == "other model name":
        argv += ["--model-name", "other"]
    elif case == "no lineage":
        for version in Repository(root, "stoke").versions():
            os.remove(os.path.join(Root(root).models("stoke"), str(version), "assets.extra", "stoke_lineage.json"))
    elif case in DAMAGED:
        served = Repository(root, "stoke").versions()[-1]
        path = os.path.join(Root(root).models("stoke"), str(served), *DAMAGED[case])
        with open(path, "r+b") as f:
            if case == "index not an index":
                f.write(b"not an index")
            f.truncate(os.path.getsize(path) // 2)
    else:
        argv += ["--span", "1"]
    code, summary = check(*argv)
    (span,) = summary["spans"]
    assert code == 0 and span["label_check"]["status"] == "skipped" and why in span["label_check"]["reason"]
    assert not [a for a in span["anomalies"] if a["kind"] == "label_error"]
    record = read_result(Root(root).datacheck(span["span"]), DataCheckRecord)
    assert record.label_check.status == "skipped" and why in record.label_check.reason
    assert f"label check skipped: {span['label_check']['reason']}" in datacheck.describe(summary)
    shutil.rmtree(root)


def test_a_model_trained_on_a_span_number_may_judge_other_records_published_under_it(trained_runs, tmp_path):
    """Out-of-sample is by the span's manifest, not its number: span 1 published again (its folder deleted by
    hand) holds records the served model never saw."""
    from components.datacheck import predictions

    root = copy_root(trained_runs, tmp_path)
    assert "was trained on span 1" in predictions.served(Root(root), "stoke", Spans(root).read_manifest(1))
    manifest = Root(root).manifest(1)
    write_json(manifest, read_json(manifest) | {"created": "2031-01-01T00:00:00Z"})
    assert isinstance(predictions.served(Root(root), "stoke", Spans(root).read_manifest(1)), predictions.Served)


def test_a_night_of_one_class_is_judged_and_one_of_no_known_class_skips_the_label_check(trained_runs, tmp_path):
    """Three nights of one class each: reds in their folder (a night of one camera: it trains with a warning),
    reds sorted wholesale into the green folder (a relabel: quarantined), and yellows, a class the served
    model does not know (held back as a new label, the label check skipped and saying why). None is left
    unchecked, and the record, the summary's lines and the report say what the label check did."""
    root = copy_root(trained_runs, tmp_path)
    publish(root, 2, [(0, 0)] * 60)
    publish(root, 3, [(0, 1)] * 60)
    publish(root, 4, [(0, 3)] * 60)
    code, summary = check("--root", root)
    assert code == 0 and Spans(root).unchecked() == []
    one, relabelled, unknown = summary["spans"]
    assert (one["status"], one["label_check"]["status"], one["label_check"]["checked"]) == ("warning", "done", 60)
    assert one["label_check"]["flagged"] == 0 and {a["severity"] for a in one["anomalies"]} == {"warning"}
    assert (relabelled["status"], relabelled["label_check"]["flagged"]) == ("quarantined", 59)  # cleanlab keeps one
    assert [(p["given"], p["predicted"]) for p in relabelled["label_check"]["pairs"]] == [("green", "red")]
    assert unknown["status"] == "quarantined" and unknown["label_check"]["status"] == "skipped"
    why = unknown["label_check"]["reason"]
    assert why.startswith("none of the span's records is of a class the served model answers (60 of classes")
    assert read_result(Root(root).datacheck(4), DataCheckRecord).label_check.reason == why
    assert f"label check skipped: {why}" in datacheck.describe(summary)
    assert {s.span for s in Spans(root).shards("train")} == {1, 2}

    run = Root(root).run("r1")
    write_json(run.result("datacheck"), summary)
    markdown = write_report(run)["markdown"]
    assert f"Label check skipped: {why}." in markdown
    assert "Label check by the served model" in markdown.split("Span 3,")[0].split("Span 2,")[1]


def test_a_class_the_served_model_keeps_without_answering_is_not_judged(trained_runs, tmp_path):
    """A served version that keeps blue's id without a record of blue (its span held back when the version
    trained) gives blue probability 0: blue records are not judged, as those of a class it does not know,
    instead of each one flagged as a file the model says is something else."""
    root = copy_root(trained_runs, tmp_path)
    repository = Repository(root, "stoke")
    uri = repository.lineage_uri(repository.newest())
    write_json(uri, {**json.load(open(uri)), "untrained": ["blue"]})
    publish(root, 2, CLEAN)
    code, summary = check("--root", root)
    labels = summary["spans"][0]["label_check"]
    assert code == 0 and (labels["status"], labels["checked"], labels["unknown"], labels["flagged"]) == ("done", 40, 20, 0)
