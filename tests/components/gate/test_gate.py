"""`stoke gate`: TFMA metrics, the blessing and its plain-word reasons, the serving contract check."""
from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from components.common.files import write_json
from components.common.repository import Repository
from components.contracts.layout import Root
from components.gate import answers
from components.gate.warmup import read_prediction_logs, request_images
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span
from tests.components.gate_runs import copy_root, gate_scenario, scenario_serving_checks, train_run, validate_run
from tests.prism import prism_tried


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


def test_learned_model_is_blessed_with_every_metric(trained_runs):
    code, summary = trained_runs["validate"]["good"]
    assert code == 0 and summary["blessed"] and summary["reasons"] == []
    metrics = summary["metrics"]
    assert metrics["example_count"] == 24
    assert metrics["accuracy"] > metrics["majority_class_rate"] == pytest.approx(8 / 24)
    assert metrics["top_k_accuracy"] >= metrics["accuracy"] and summary["thresholds"]["top_k"] == 3
    assert set(metrics["per_class_accuracy"]) == {"red", "green", "blue"}
    matrix = metrics["confusion_matrix"]
    assert sum(map(sum, matrix)) == 24
    assert sum(matrix[i][i] for i in range(3)) / 24 == pytest.approx(metrics["accuracy"])
    assert summary["baseline_version"] is None and summary["tfma_validation_ok"]
    assert any("no served version yet" in note for note in summary["notes"])

    run_dir = os.path.join(trained_runs["root"], "runs", "good")
    assert os.path.exists(os.path.join(run_dir, "BLESSED")) and not os.path.exists(os.path.join(run_dir, "NOT_BLESSED"))
    assert json.load(open(summary["gate_uri"]))["metrics"] == metrics
    assert open(summary["confusion_matrix_uri"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert any(name.startswith("metrics") for name in os.listdir(os.path.join(run_dir, "tfma")))


def test_model_that_learned_nothing_is_refused_in_plain_words(trained_runs):
    code, summary = trained_runs["validate"]["flat"]
    good_version = trained_runs["push"]["good"][1]["version"]
    assert code == 0 and not summary["blessed"]
    assert summary["baseline_version"] == good_version
    regression = [r for r in summary["reasons"] if "below the served version" in r]
    assert len(regression) == 1
    assert f"below the served version {good_version}" in regression[0] and "allowed regression 0.01" in regression[0]
    assert f"{summary['metrics']['accuracy']:.4f}" in regression[0]
    run_dir = os.path.join(trained_runs["root"], "runs", "flat")
    assert os.path.exists(os.path.join(run_dir, "NOT_BLESSED")) and not os.path.exists(os.path.join(run_dir, "BLESSED"))
    # Under --decision evidence TFMA holds the floor only: its change threshold compares point estimates.
    metrics = summary["metrics"]
    assert summary["tfma_validation_ok"] == (metrics["accuracy"] > metrics["majority_class_rate"])


def test_a_clearly_worse_model_is_refused_with_evidence(trained_runs):
    """Both models answered the same 24 records one by one: the flat one's drop is far beyond noise."""
    _, summary = trained_runs["validate"]["flat"]
    comparison = summary["comparison"]
    (lower, upper), (b, c) = comparison["interval"], comparison["discordant"]
    assert comparison["decision"] == "evidence" and comparison["version"] == summary["baseline_version"]
    assert comparison["example_count"] == 24 and c > b and comparison["p_value"] < 0.05 and upper < -0.01
    # The paired counts add up to TFMA's accuracies.
    assert comparison["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
    assert comparison["baseline_accuracy"] == pytest.approx(summary["baseline"]["accuracy"], abs=1e-6)
    (reason,) = [r for r in summary["reasons"] if "below the served version" in r]
    assert f"95% interval of the difference [{lower:+.3f}, {upper:+.3f}]" in reason
    assert f"McNemar's exact p = {comparison['p_value']:.2g}" in reason
    # 24 records cannot see a drop of 0.01, and the notes say so.
    assert any(note.startswith("24 eval images can only detect drops of about") for note in summary["notes"])
    assert json.load(open(summary["gate_uri"]))["comparison"] == comparison


def test_a_class_the_candidate_lost_is_named_with_its_figures(trained_runs):
    """The flat model scores 8 of 24 where the served one scored 24 of 24, so one class at least keeps
    at most 2 of its 8: at least 6 of 6 discordant records against it, p <= 1/64, within Holm's 0.05/3."""
    _, summary = trained_runs["validate"]["flat"]
    comparison, metrics, served = summary["comparison"], summary["metrics"], summary["baseline"]
    table = comparison["per_class"]
    assert table["version"] == summary["baseline_version"] and table["level"] == pytest.approx(0.05)
    rows = {row["label"]: row for row in table["classes"]}
    assert sorted(rows) == sorted(TRAIN_LABELS)
    for name, row in rows.items():  # the counts, record by record, are TFMA's per-class figures
        n = row["example_count"]
        assert n == metrics["per_class_examples"][name] == 8
        assert row["right"] / n == pytest.approx(metrics["per_class_accuracy"][name], abs=1e-6)
        assert row["baseline_right"] / n == pytest.approx(served["per_class_accuracy"][name], abs=1e-6)
    assert [sum(row["discordant"][i] for row in rows.values()) for i in (0, 1)] == comparison["discordant"]
    worst = min(rows.values(), key=lambda row: row["right"])
    assert worst["verdict"] == "worse" and worst["p_value"] <= 1 / 64
    assert any(reason.startswith(f"class {worst['label']} fell from {worst['baseline_right']}/8 right under the served "
                                 f"version {summary['baseline_version']} to {worst['right']}/8")
               for reason in summary["reasons"]), summary["reasons"]
    # A candidate about as good as the served one loses no class.
    _, mixed = trained_runs["validate"]["mixed"]
    assert mixed["blessed"] and len(mixed["comparison"]["per_class"]["classes"]) == 3
    assert "worse" not in {row["verdict"] for row in mixed["comparison"]["per_class"]["classes"]}


@pytest.fixture(scope="module")
def flat_gated_again(trained_runs, tmp_path_factory):
    """Run `flat` gated again under --decision point on a copy of the scenario's ROOT, whose served version
    (mixed's) names the first version (good's) as its reference, as a warm run held to it would: one gate
    run for the point rule's test and the reference's, and for the runner TFMA's job runs on."""
    root = copy_root(trained_runs, tmp_path_factory.mktemp("flat-again"))
    repo = Repository(root, "stoke")
    served = repo.lineage(repo.newest())
    write_json(repo.lineage_uri(served.version), served.model_copy(update={"reference": repo.versions()[0]}).to_json())
    with pytest.MonkeyPatch.context() as monkeypatch:
        scenario_serving_checks(trained_runs, monkeypatch)
        tried = prism_tried(monkeypatch)
        return (root, *validate_run(root, "flat", "--decision", "point"), tried)


def test_point_decision_keeps_the_point_rule_and_its_wording(flat_gated_again):
    _, code, summary, _ = flat_gated_again
    accuracy, served = summary["metrics"]["accuracy"], summary["baseline"]["accuracy"]
    assert code == 0 and not summary["blessed"] and summary["comparison"]["decision"] == "point"
    assert f"accuracy {accuracy:.4f} is {served - accuracy:.4f} below the served version {summary['baseline_version']} " \
           f"({served:.4f}); allowed regression 0.01" in summary["reasons"]
    assert not any("eval images can only detect" in note for note in summary["notes"])
    assert not summary["tfma_validation_ok"]  # TFMA's change threshold is back


def test_the_answers_a_push_kept_are_what_the_next_gate_holds_candidates_to(trained_runs, flat_gated_again):
    """good's gate recorded its answers and its push kept them in the first version. Gated again, flat is
    held to them, record by record, as when its first gate answered the first version anew."""
    root, code, summary, _ = flat_gated_again
    first = trained_runs["push"]["good"][1]["version"]
    repo = Repository(root, "stoke")
    with open(repo.answers_uri(first), "rb") as kept, open(Root(root).run("good").answers, "rb") as gated:
        recorded = kept.read()
        assert recorded == gated.read()
    assert answers.decode(recorded, "").labels == TRAIN_LABELS and len(answers.decode(recorded, "").records) == 24
    assert code == 0 and summary["reference"] == {"version": first, "kept": False}  # flat trained fully
    table = summary["comparison"]["reference"]
    assert (table["version"], table["pushed_at"], table["versions_since"]) == (first, repo.lineage(first).pushed_at, 1)
    _, then = trained_runs["validate"]["flat"]
    assert then["comparison"]["per_class"]["version"] == first
    assert table["classes"] == then["comparison"]["per_class"]["classes"]
    worst = next(row for row in table["classes"] if row["verdict"] == "worse")
    assert any(reason.startswith(f"class {worst['label']} fell from {worst['baseline_right']}/8 right under the "
                                 f"reference version {first} (pushed {table['pushed_at'][:10]}, ")
               for reason in summary["reasons"]), summary["reasons"]


def test_tfma_runs_on_beams_fnapi_runner_and_never_tries_prism(flat_gated_again):
    """TFMA's job runs on the FnApiRunner the suite tests, never on the PrismRunner that DirectRunner tries first:
    its binary is a download from github.com as the job starts, which waits without end on a network that
    drops it."""
    _, code, _, tried = flat_gated_again
    assert code == 0 and tried == []


def test_serving_contract_checked_in_a_fresh_process(trained_runs):
    check = trained_runs["validate"]["good"][1]["serving_check"]
    assert check["ok"] and check["problems"] == [] and check["classes"] == 3
    assert check["signature"]["probabilities"]["dtype"] == "float32"
    assert check["signature"]["class_ids"]["dtype"] == "int64"
    assert check["latency_ms"]["batch_1"]["median_ms"] > 0 and check["latency_ms"]["batch_32"]["median_ms"] > 0
    # No tensorflow_model_server and no container engine here: the report must say so.
    assert check["real_server"]["status"] == "skipped" and "tensorflow_model_server" in check["real_server"]["reason"]


def test_warmup_requests_are_real_eval_images(trained_runs):
    logs = read_prediction_logs(trained_runs["validate"]["good"][1]["warmup_uri"])
    sizes = [len(request_images(log)) for log in logs]
    assert sizes == [1, 8]
    request = logs[0].predict_log.request
    assert (request.model_spec.name, request.model_spec.signature_name) == ("stoke", "serving_default")
    assert request_images(logs[0])[0][:2] == b"\xff\xd8"  # a JPEG from the eval split


def test_a_candidate_missing_a_served_class_is_refused_whatever_its_accuracy(trained_runs, tmp_path, monkeypatch):
    scenario_serving_checks(trained_runs, monkeypatch)
    root = copy_root(trained_runs, tmp_path)
    repo = Repository(root, "stoke")
    newest = repo.newest()
    lineage_path = repo.lineage_uri(newest)
    lineage = json.load(open(lineage_path))
    lineage["labels"] = ["red", "green", "blue", "violet"]
    json.dump(lineage, open(lineage_path, "w"))
    # The served version answers violet; the candidate (metrics.json: red, green, blue) cannot.
    code, summary = validate_run(root, "flat", "--min-accuracy", "0")
    assert code == 0 and not summary["blessed"]
    assert summary["baseline_version"] is None and summary["served_version"] == newest
    assert summary["reasons"] == [next(r for r in summary["reasons"] if "does not know violet" in r)]
    assert f"served version {newest}" in summary["reasons"][0]


def white_records(count: int, offset: int) -> list[tuple[bytes, str, int]]:
    """A fourth class the served model never saw: every channel bright."""
    records = []
    for i in range(offset, offset + count):
        pixels = np.random.default_rng(i).integers(170, 255, size=(32, 40, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        records.append((buffer.getvalue(), "jpeg", 3))
    return records


def test_added_classes_are_compared_on_the_classes_both_know(trained_runs, tmp_path):
    """The served model knows red, green, blue; the candidate adds white and learned nothing. The
    gate must still compare it with the served version, on the three classes both know."""
    root = copy_root(trained_runs, tmp_path)
    served = Repository(root, "stoke").newest()
    write_span(root, 2, {"train": tiny_records(12, offset=7000) + white_records(12, 7100),
                         "eval": tiny_records(6, offset=7200) + white_records(6, 7300)},
               TRAIN_LABELS + ["white"], {"train": 1, "eval": 1})
    train_run(root, "wider", "--epochs", "1", "--precision", "float32", "--learning-rate", "0")
    code, summary = validate_run(root, "wider")
    assert code == 0 and not summary["blessed"] and summary["labels"] == TRAIN_LABELS + ["white"]
    assert summary["baseline_version"] == served and summary["thresholds"]["compared_to_baseline"]
    shared = summary["shared_classes"]
    assert shared["classes"] == TRAIN_LABELS and shared["example_count"] == 30
    assert set(shared["per_class_accuracy"]) == set(shared["baseline_per_class_accuracy"]) == set(TRAIN_LABELS)
    assert shared["baseline_accuracy"] > shared["accuracy"]
    assert any(reason.startswith(f"on the 3 classes both models know, accuracy {shared['accuracy']:.4f}")
               and f"below the served version {served}" in reason for reason in summary["reasons"]), summary["reasons"]
    assert any("added white" in note and "compared on the 3 classes both know" in note for note in summary["notes"])


def test_bad_arguments_are_one_line_errors(trained_runs, capsys):
    from components.gate import gate as validate

    assert validate.run(["--root", trained_runs["root"], "--run-id", "missing", "--json"]) == 1
    assert "training did not finish" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert validate.run(["--root", trained_runs["root"], "--run-id", "good", "--model-name", "../etc", "--json"]) == 2
    assert "--model-name" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


def test_a_candidate_trained_in_another_environment_gets_a_note_naming_what_changed(trained_runs, tmp_path):
    """The gate notes, never refuses, a candidate whose environment differs from the served version's lineage."""
    from components.contracts.results import TrainMetrics
    from components.gate.gate import environment_notes

    code, summary = trained_runs["validate"]["mixed"]  # trained in the same environment as the served version
    assert code == 0 and summary["blessed"] and not [n for n in summary["notes"] if "environment" in n]
    root = copy_root(trained_runs, tmp_path)
    repo, version = Repository(root, "stoke"), trained_runs["push"]["good"][1]["version"]
    trained = TrainMetrics.model_validate(json.load(open(os.path.join(root, "runs", "mixed", "metrics.json"))))
    assert environment_notes(trained, repo, version) == []
    newer = trained.model_copy(update={"environment": trained.environment.model_copy(update={
        "tensorflow": "2.22.0", "lock": "requirements/runtime.lock", "lock_sha256": "d4e5f6" + "0" * 58})})
    path = os.path.join(root, "models", "stoke", str(version), "assets.extra", "stoke_lineage.json")
    served = json.load(open(path))
    served["environment"].update(tensorflow="2.21.0", lock="requirements/runtime.lock", lock_sha256="a1b2c3" + "0" * 58)
    json.dump(served, open(path, "w"))
    assert environment_notes(newer, repo, version) == [
        f"trained in another environment than served version {version}: TensorFlow 2.21.0 -> 2.22.0; lock a1b2c3 -> d4e5f6"]
    del served["environment"]  # a version pushed before Stoke recorded environments
    json.dump(served, open(path, "w"))
    assert environment_notes(newer, repo, version) == [f"served version {version}: environment not recorded"]
