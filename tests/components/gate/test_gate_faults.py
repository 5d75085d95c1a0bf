"""`stoke gate` on a truncated eval shard or a read-only ROOT: one error line naming the shard or
the path, never a traceback."""
from __future__ import annotations

import json
import os

import pytest

from components.common.spans import Spans
from components.contracts.layout import Root
from tests.components.faults import read_only
from tests.components.gate_runs import copy_root, gate_scenario
from tests.full_disk import small_disk


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


def _gate(root: str, capsys) -> tuple[int, str, dict]:
    from components.gate import gate as validate

    code = validate.run(["--root", root, "--run-id", "good", "--json"])
    captured = capsys.readouterr()
    return code, captured.err, json.loads(captured.out.strip().splitlines()[-1])


def _truncate(shard_uri: str) -> None:
    size = os.path.getsize(shard_uri)
    with open(shard_uri, "r+b") as f:
        f.truncate(size * 2 // 3)


def test_a_truncated_eval_shard_is_named_in_one_line(trained_runs, tmp_path, capsys):
    root = copy_root(trained_runs, tmp_path)
    shard = Spans(root).shards("eval", [1])[0].uri
    _truncate(shard)
    code, err, summary = _gate(root, capsys)
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("stoke gate: error: corrupt eval shard: ") and shard in err, err
    assert "Traceback" not in err and shard in summary["error"]


def test_an_eval_shard_tensorflow_reads_short_is_named_in_one_line(trained_runs, tmp_path, capsys):
    """Its bytes are those its manifest names and every CRC holds, but TensorFlow reads 3 of its 12 records
    without an error (TFMA, through Beam's reader, would read all 12): the gate refuses before judging a model."""
    from tests.components.conftest import read_short_by_tensorflow

    root = copy_root(trained_runs, tmp_path)
    shard = read_short_by_tensorflow(root, 1, "eval")
    code, err, summary = _gate(root, capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert summary["error"].startswith(f"TensorFlow reads shards short, without an error: {shard} (3 of 12 records)")
    assert "ingest their sources again into a new span" in summary["error"]


def test_an_eval_shard_changed_after_publishing_is_no_evidence(trained_runs, tmp_path, capsys):
    """Its records read, but they are not those published (every label 0): the gate refuses in one line,
    before TFMA, rather than blessing on them."""
    from tests.components.conftest import relabel

    root = copy_root(trained_runs, tmp_path)
    shard = Spans(root).shards("eval", [1])[0].uri
    relabel(shard, 0)
    code, err, summary = _gate(root, capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert summary["error"].startswith(f"span 1 changed after it was published: {shard} "), summary["error"]
    assert "restore the span's folder" in summary["error"]


def test_a_shard_that_breaks_inside_tfma_is_named_too(trained_runs, tmp_path, capsys, monkeypatch):
    """The shard check and the label scan pass (they read the shard before the damage), so TFMA, inside Beam,
    hits it."""
    from components.gate import gate as validate

    root = copy_root(trained_runs, tmp_path)
    shards = Spans(root).shards("eval", [1])
    scanned = validate._scan_eval(shards, 4)
    monkeypatch.setattr(validate, "_staged", lambda _config, found: (found, []))
    monkeypatch.setattr(validate, "_scan_eval", lambda _shards, _keep: scanned)
    _truncate(shards[0].uri)
    code, err, _ = _gate(root, capsys)
    assert code == 1 and err.count("\n") == 1 and shards[0].uri in err and "Traceback" not in err, err


def test_a_read_only_root_is_one_line_naming_the_path(trained_runs, tmp_path, capsys, monkeypatch):
    """Tests run as root, which writes anywhere: read_only() makes every write under ROOT raise EROFS.
    The gate finds out before TFMA runs, not when it writes its results."""
    root = copy_root(trained_runs, tmp_path)
    read_only(monkeypatch, root)
    code, err, summary = _gate(root, capsys)
    assert code == 1, err
    run = os.path.join(root, "runs", "good")
    assert err == f"stoke gate: error: {run} cannot be written: read-only file system\n", err
    assert summary["error"] == f"{run} cannot be written: read-only file system"


def test_a_disk_that_fills_as_tfma_writes_is_one_line_naming_its_output_and_the_next_gate_blesses(
        trained_runs, tmp_path, capsys, monkeypatch):
    """The disk under ROOT fills as TFMA starts (tests/full_disk.py): Beam's file sink says it without a file,
    inside Beam's RuntimeError. One line naming TFMA's output folder; once there is space the gate runs again."""
    from components.gate import gate as validate

    with small_disk(tmp_path / "disk", size_mb=64) as disk:
        root, evaluate = copy_root(trained_runs, tmp_path / "disk"), validate.run_tfma

        def full_first(*args):
            disk.fill()
            return evaluate(*args)

        with monkeypatch.context() as patch:
            patch.setattr(validate, "run_tfma", full_first)
            code, err, summary = _gate(root, capsys)
        tfma = os.path.join(root, "runs", "good", "tfma")
        assert code == 1 and err == f"stoke gate: error: {tfma} cannot be written: no space left on device\n", err
        disk.free()
        code, err, summary = _gate(root, capsys)
        assert code == 0 and summary["blessed"], err


def quarantine(root: str, span: int) -> None:
    from components.common.files import write_json
    from components.contracts.summaries import DataAnomaly, DataCheckRecord

    drift = DataAnomaly(kind="label_drift", severity="error", message="label drift 0.6")
    record = DataCheckRecord(span=span, check_version=1, status="quarantined", checked_at="2026-12-01T02:00:00Z",
                             reasons=[drift.message], anomalies=[drift], manifest_sha256=Spans(root).manifest_sha256(span))
    write_json(Root(root).datacheck(span), record.to_json())


@pytest.mark.parametrize("marker", ["the data check's", "not JSON"])
def test_a_span_quarantined_after_training_is_a_one_line_refusal(trained_runs, tmp_path, capsys, marker):
    """The run trained on span 1; the data check quarantined it since (or its record was damaged). Its
    records are no evidence for a blessing until the check lets the span in: the gate refuses in one line
    saying how."""
    root = copy_root(trained_runs, tmp_path)
    record = Root(root).datacheck(1)
    if marker == "not JSON":  # a damaged record lets nothing in
        open(record, "w").write("{")
    else:
        quarantine(root, 1)
    gate_file = os.path.join(root, "runs", "good", "gate.json")
    before = open(gate_file).read()
    code, err, summary = _gate(root, capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("stoke gate: error: run good trained on a span the data check does not let in now: "
                          "span 1 "), err
    assert (f"stoke spans release 1 --root {root}" if marker != "not JSON" else "stoke datacheck") in err
    assert summary["error"] in err
    assert open(gate_file).read() == before  # nothing written


def test_a_quarantined_span_is_refused_without_a_trained_model_too(tmp_path, capsys):
    """The gate reads the run's metrics and candidate, then the spans it trained on: the refusal comes
    before any model is loaded, so a stand-in run shows it in a moment."""
    import pathlib

    from components.common.files import write_json
    from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span

    root = str(tmp_path / "root")
    write_span(root, 1, {"train": tiny_records(4), "eval": tiny_records(4, offset=100)}, TRAIN_LABELS,
               {"train": 1, "eval": 1})
    run = Root(root).run("good")
    metrics = json.loads((pathlib.Path(__file__).parents[1] / "contracts" / "samples" / "metrics.json").read_text())
    write_json(run.metrics, {**metrics, "run_id": "good", "spans": [1], "labels": TRAIN_LABELS})
    os.makedirs(run.candidate)
    open(os.path.join(run.candidate, "saved_model.pb"), "wb").close()
    quarantine(root, 1)
    code, err, summary = _gate(root, capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "does not let in now: span 1 is quarantined" in err and f"stoke spans release 1 --root {root}" in err


def test_a_served_version_that_cannot_be_loaded_is_one_line_without_beams_tracebacks(trained_runs, tmp_path):
    """Weights cut short: TFMA's workers fail loading the served version and Beam logs each failure
    with its traceback. The gate's stderr, which a run's log shows, holds its own line naming the
    version; Beam's log is for STOKE_DEBUG=1."""
    import re
    import shlex
    import subprocess
    import sys

    from components.common.repository import Repository

    root = copy_root(trained_runs, tmp_path)
    repo = Repository(root, "stoke")
    served = repo.newest()
    weights = os.path.join(repo.path, str(served), "variables", "variables.data-00000-of-00001")
    os.truncate(weights, 100)
    # As the flow starts it: TF_USE_LEGACY_KERAS is this test process's, set by the training package it imported.
    env = {key: value for key, value in os.environ.items() if key not in ("STOKE_DEBUG", "TF_USE_LEGACY_KERAS")}
    result = subprocess.run([sys.executable, "-m", "components.gate", "--root", root, "--run-id", "good"],
                            env=env, capture_output=True, text=True, timeout=600)
    # TensorFlow's own start-up lines (absl's, written by its C++ runtime) are not Beam's: the run log files them under DEBUG.
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not re.match(r"[IWEF]\d{4} |WARNING: All log messages before absl", line)]
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"stoke gate: error: the served version {served} ({repo.version_uri(served)}) cannot "
                               "be loaded (IndexError: Read less bytes than requested); restore it"), lines
    # The fix is a command the user can run as printed: rollback needs the ROOT and takes out the newest version.
    assert f"(`stoke rollback --root {shlex.quote(root)} --model-name stoke`), then gate again" in lines[0], lines
    assert os.path.getsize(weights) == 100 and repo.versions()[-1] == served  # the gate changes nothing there
