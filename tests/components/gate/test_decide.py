"""The gate's decision alone: metric dicts written by hand, no model, no TFMA, no TensorFlow."""
from __future__ import annotations

import subprocess
import sys

from components.gate.gate import Floor, decide

SERVED = {"ok": True, "problems": [], "real_server": {"status": "passed"}}
MAJORITY = Floor(0.5, False, "must beat 0.5000, the share of the most common class (red) in the eval split", "red")
REQUIRED = Floor(0.9, True, "--min-accuracy", None)


def metrics(accuracy: float, per_class: dict[str, float] | None = None, examples: dict[str, int] | None = None):
    return {"accuracy": accuracy, "per_class_accuracy": per_class or {}, "per_class_examples": examples or {}}


def verdict(candidate, baseline=None, *, version=None, shared=None, floor=MAJORITY, max_regression=0.01,
            serving=SERVED, validation_ok=True, failures=()):
    return decide(candidate, baseline, version, shared, floor, max_regression, serving, validation_ok, list(failures))


def test_no_baseline_blesses_above_the_floor():
    assert verdict(metrics(0.75)) == (True, [], [], None)


def test_below_the_required_accuracy_says_so():
    blessed, reasons, _, _ = verdict(metrics(0.85), floor=REQUIRED)
    assert not blessed and reasons == ["accuracy 0.8500 is below the required 0.9000 (--min-accuracy)"]
    assert verdict(metrics(0.9), floor=REQUIRED).blessed  # --min-accuracy is met at equality


def test_the_majority_share_must_be_beaten_not_matched():
    blessed, reasons, _, _ = verdict(metrics(0.5))
    assert not blessed and reasons == [
        "accuracy 0.5000 does not beat 0.5000, what always answering the most common class (red) scores "
        "on the eval split"]


def test_regression_beyond_the_allowance_is_refused():
    decision = verdict(metrics(0.8), metrics(0.9), version=3, max_regression=0.05)
    assert not decision.blessed and decision.reasons == [
        "accuracy 0.8000 is 0.1000 below the served version 3 (0.9000); allowed regression 0.05"]
    assert decision.shared_classes is None


def test_regression_within_the_allowance_is_blessed():
    assert verdict(metrics(0.88), metrics(0.9), version=3, max_regression=0.05) == (True, [], [], None)


SHARED = ["red", "green", "blue"]
CANDIDATE = metrics(0.45, {"red": 0.5, "green": 0.75, "blue": 1.0, "white": 0.0},
                    {"red": 4, "green": 4, "blue": 2, "white": 6})
BASELINE = metrics(0.9, {"red": 1.0, "green": 1.0, "blue": 0.5})
WHITE = Floor(0.375, False, "must beat 0.3750, the share of the most common class (white) in the eval split",
              "white")
PER_CLASS = "per class, candidate vs served: red 0.5000 vs 1.0000, green 0.7500 vs 1.0000, blue 1.0000 vs 0.5000"


def test_added_classes_compare_on_the_classes_both_know():
    blessed, reasons, notes, shared = verdict(CANDIDATE, BASELINE, version=3, shared=SHARED, floor=WHITE)
    assert shared["classes"] == SHARED and shared["example_count"] == 10
    assert shared["accuracy"] == 0.7 and shared["baseline_accuracy"] == 0.9
    assert shared["per_class_accuracy"] == {"red": 0.5, "green": 0.75, "blue": 1.0}
    assert not blessed and reasons == [
        "on the 3 classes both models know, accuracy 0.7000 is 0.2000 below the served version 3 (0.9000); "
        "allowed regression 0.01"]
    assert notes == [PER_CLASS]


def test_shared_classes_replace_the_overall_comparison():
    # Overall the candidate is far below the served 0.9; on the shared classes it is within 0.25.
    decision = verdict(CANDIDATE, BASELINE, version=3, shared=SHARED, floor=WHITE,
                       max_regression=0.25)
    assert decision.blessed and decision.reasons == [] and decision.notes == [PER_CLASS]


def test_a_failed_serving_check_refuses_and_notes_the_skipped_server():
    serving = {"ok": False, "problems": ["the SavedModel has no serving_default signature"],
               "real_server": {"status": "skipped", "reason": "the in-process check failed first"}}
    blessed, reasons, notes, _ = verdict(metrics(0.75), serving=serving, validation_ok=False, failures=["x"])
    assert not blessed and reasons == ["serving check: the SavedModel has no serving_default signature"]
    assert notes == ["real TF Serving check skipped: the in-process check failed first"]


def test_tfma_validation_failure_is_a_reason_only_when_there_is_no_other():
    blessed, reasons, _, _ = verdict(metrics(0.75), validation_ok=False, failures=["accuracy too low", "change"])
    assert not blessed and reasons == ["TFMA's validation failed: accuracy too low; change"]
    _, reasons, _, _ = verdict(metrics(0.85), floor=REQUIRED, validation_ok=False, failures=["accuracy too low"])
    assert reasons == ["accuracy 0.8500 is below the required 0.9000 (--min-accuracy)"]


def test_the_gate_decides_without_tensorflow():
    code = ("import sys, components.gate.gate; "
            "print([m for m in ('tensorflow', 'tensorflow_model_analysis') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
