"""The report says what a user needs and no puzzle: no top-k accuracy that cannot be below 1, what
became of near-copies, the probe beside a profiler that disagrees,
a collapsed model and training's warnings first."""
from __future__ import annotations

from pathlib import Path

from components.common.files import read_json, write_json
from components.contracts.layout import Root
from components.report.report import write_report

SAMPLES = Path(__file__).parents[1] / "contracts" / "samples"


def run_with(tmp_path, gate=None, train=None, ingest=None):
    run = Root(str(tmp_path)).run("r1")
    for stage, name, change in (("gate", "gate.json", gate), ("train", "metrics.json", train),
                                ("ingest", "ingest-summary.json", ingest)):
        data = read_json(str(SAMPLES / name))
        write_json(run.result(stage), change(data) if change else data)
    return write_report(run)


def test_top_k_accuracy_is_shown_only_when_k_is_below_the_classes(tmp_path):
    shown = run_with(tmp_path)["markdown"]  # 10 classes, k = 5
    assert "| top_k_accuracy |" in shown

    def three_classes(gate):
        gate["metrics"]["top_k"] = 3
        gate["labels"] = gate["labels"][:3]
        return gate
    assert "| top_k_accuracy |" not in run_with(tmp_path / "b", gate=three_classes)["markdown"]


def test_near_copies_say_what_became_of_them(tmp_path):
    def copied(ingest):
        pair = {"uri": "/in/a/1.png", "split": "eval", "other_uri": "/in/a/2.png", "other_split": "eval",
                "distance": 3, "mirrored": True}
        return {**ingest, "near_duplicates": {"count": 30, "moved": 12, "across": 1, "examples": [pair], "crowded": 400}}
    markdown = run_with(tmp_path, ingest=copied)["markdown"]
    assert "Near-copies of another image (re-encoded, resized, cropped or mirrored): 30; 12 joined their " \
           "original's split, 0 set aside, 1 left in the other split" in markdown
    assert "3 bits apart as mirror images" in markdown
    assert "alike at dHash's 9x8 (a fixed camera, scans, products on white): 400; judged by their block " \
           "colours, the distinct ones kept their own split." in markdown


def test_a_profiler_that_disagrees_with_the_probe_is_explained(tmp_path):
    def traced(metrics):
        metrics["profiler"] = {"input_percent": 12.0, "classification": "potentially", "input_bound": False,
                               "step_time_ms": 40.0, "input_time_ms": 5.0, "steps": 10, "trace": "/t",
                               "conclusion": "Your program is POTENTIALLY input-bound because 12.0% of the total step "
                                             "time sampled is spent on 'All Others' time."}
        return metrics
    markdown = run_with(tmp_path, train=traced)["markdown"]
    assert "POTENTIALLY input-bound" in markdown and "The probe and the profiler measure different things" in markdown


def test_a_collapsed_model_and_training_warnings_come_first(tmp_path):
    def one_class(gate):
        gate["collapse"] = {"label": "cats", "answered": 14, "actual": 6, "example_count": 15}
        return gate

    def warned(metrics):
        return {**metrics, "warnings": ["only 12 training steps: a model trained from scratch rarely converges"]}
    markdown = run_with(tmp_path, gate=one_class, train=warned)["markdown"]
    head = markdown.split("## ")[0]
    assert "The model answers one class: `cats` for 14 of 15 eval images (6 of them are cats)" in head
    assert "Training: only 12 training steps" in head


def test_the_report_names_what_a_push_set_aside_in_the_model_repository(tmp_path):
    run = Root(str(tmp_path)).run("r1")
    push = read_json(str(SAMPLES / "push-summary.json")) | {"set_aside": [
        {"name": "0300", "moved_to": "/root/models/stoke/set-aside-0300",
         "reason": "TF Serving reads its name as version 300; Stoke names versions by plain decimal numbers"}]}
    write_json(run.result("push"), push)
    shown = run_with(tmp_path)["markdown"]
    assert ("Set aside `0300` as `/root/models/stoke/set-aside-0300`: TF Serving reads its name as version 300; "
            "Stoke names versions by plain decimal numbers.") in shown
