"""The gate's decision alone: metric dicts written by hand, no model, no TFMA, no TensorFlow."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from components.gate.decision import Floor, decide
from components.gate.rule import Evidence

SERVED = {"ok": True, "problems": [], "real_server": {"status": "passed"}}
MAJORITY = Floor(0.5, False, "must beat 0.5000, the share of the most common class (red) in the eval split", "red")
REQUIRED = Floor(0.9, True, "gate.min_accuracy", None)


def metrics(accuracy: float, per_class: dict[str, float] | None = None, examples: dict[str, int] | None = None):
    return {"accuracy": accuracy, "per_class_accuracy": per_class or {}, "per_class_examples": examples or {}}


def verdict(candidate, baseline=None, *, version=None, shared=None, floor=MAJORITY, max_regression=0.01,
            serving=SERVED, validation_ok=True, failures=(), evidence=None):
    return decide(candidate, baseline, version, shared, floor, max_regression, serving, validation_ok, list(failures),
                  evidence)


def test_no_baseline_blesses_above_the_floor():
    assert verdict(metrics(0.75)) == (True, [], [], None, None)


def test_below_the_required_accuracy_says_so():
    blessed, reasons, *_ = verdict(metrics(0.85), floor=REQUIRED)
    assert not blessed and reasons == ["accuracy 0.8500 is below the required 0.9000 (gate.min_accuracy)"]
    assert verdict(metrics(0.9), floor=REQUIRED).blessed  # --min-accuracy is met at equality


def test_the_majority_share_must_be_beaten_not_matched():
    blessed, reasons, *_ = verdict(metrics(0.5))
    assert not blessed and reasons == [
        "accuracy 0.5000 does not beat 0.5000, what always answering the most common class (red) scores "
        "on the eval split"]


def one_class(answer: int, labels: list[int], classes: int = 2) -> dict:
    """Metrics of a model that answers class `answer` for every eval record, as TFMA reports them:
    accuracy in float32, the confusion matrix in whole records."""
    matrix = [[0] * classes for _ in range(classes)]
    for label in labels:
        matrix[label][answer] += 1
    right = sum(label == answer for label in labels)
    return {**metrics(float(np.float32(right / len(labels)))), "confusion_matrix": matrix, "example_count": len(labels)}


def test_an_exact_tie_with_the_majority_share_is_not_a_win():
    # 3 of 5 eval records are class 0; a model answering 0 for all of them is right 3 times, as often
    # as always answering the majority class: TFMA's float32 0.6000000238 must not beat 3/5.
    tie = one_class(0, [0, 0, 0, 1, 1])
    assert tie["accuracy"] > 0.6
    floor = Floor(0.6, False, "must beat 0.6000 (3 of 5)", "cats", majority_count=3, total=5)
    blessed, reasons, *_ = verdict(tie, floor=floor)
    assert not blessed and reasons == ["accuracy 0.6000 (3 of 5 right) does not beat 0.6000 (3 of 5), what always "
                                       "answering the most common class (cats) scores on the eval split"]
    won = {**tie, "confusion_matrix": [[3, 0], [0, 2]], "accuracy": 1.0}
    assert verdict(won, floor=floor).blessed


@pytest.mark.parametrize("right, total, required, blessed", [
    (6, 15, 0.4, True),  # exactly the required share: met at equality, decided on the fraction 6/15 = 2/5
    (5, 15, 0.4, False), (9, 10, 0.9, True), (8, 10, 0.9, False), (1, 3, 1 / 3, True), (2, 7, 0.2857, True),
])
def test_a_required_accuracy_is_met_in_exact_counts(right, total, required, blessed):
    matrix = [[right, 0], [total - right, 0]]  # answers class 0; `right` of the records are class 0
    candidate = {**metrics(float(np.float32(right / total))), "confusion_matrix": matrix, "example_count": total}
    floor = Floor(required, True, "gate.min_accuracy", None, total=total)
    assert verdict(candidate, floor=floor).blessed == blessed


def test_without_counts_the_float32_figures_are_compared_at_float32():
    floor = Floor(0.4, False, "must beat 0.4000", "cats")
    assert not verdict(metrics(float(np.float32(0.4))), floor=floor).blessed  # 0.4000000059604645 is 0.4
    assert verdict(metrics(float(np.float32(0.41))), floor=floor).blessed


def test_regression_beyond_the_allowance_is_refused():
    decision = verdict(metrics(0.8), metrics(0.9), version=3, max_regression=0.05)
    assert not decision.blessed and decision.reasons == [
        "accuracy 0.8000 is 0.1000 below the served version 3 (0.9000); allowed regression 0.05"]
    assert decision.shared_classes is None


def test_regression_within_the_allowance_is_blessed():
    assert verdict(metrics(0.88), metrics(0.9), version=3, max_regression=0.05) == (True, [], [], None, None)


SHARED = ["red", "green", "blue"]
CANDIDATE = metrics(0.45, {"red": 0.5, "green": 0.75, "blue": 1.0, "white": 0.0},
                    {"red": 4, "green": 4, "blue": 2, "white": 6})
BASELINE = metrics(0.9, {"red": 1.0, "green": 1.0, "blue": 0.5})
WHITE = Floor(0.375, False, "must beat 0.3750, the share of the most common class (white) in the eval split",
              "white")
PER_CLASS = "per class, candidate vs served: red 0.5000 vs 1.0000, green 0.7500 vs 1.0000, blue 1.0000 vs 0.5000"


def test_added_classes_compare_on_the_classes_both_know():
    blessed, reasons, notes, shared, _ = verdict(CANDIDATE, BASELINE, version=3, shared=SHARED, floor=WHITE)
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
    blessed, reasons, notes, *_ = verdict(metrics(0.75), serving=serving, validation_ok=False, failures=["x"])
    assert not blessed and reasons == ["serving check: the SavedModel has no serving_default signature"]
    assert notes == ["real TF Serving check skipped: the in-process check failed first"]


def test_tfma_validation_failure_is_a_reason_only_when_there_is_no_other():
    blessed, reasons, *_ = verdict(metrics(0.75), validation_ok=False, failures=["accuracy too low", "change"])
    assert not blessed and reasons == ["TFMA's validation failed: accuracy too low; change"]
    _, reasons, *_ = verdict(metrics(0.85), floor=REQUIRED, validation_ok=False, failures=["accuracy too low"])
    assert reasons == ["accuracy 0.8500 is below the required 0.9000 (gate.min_accuracy)"]


def test_the_gate_decides_without_tensorflow():
    code = ("import sys, components.gate.gate; "
            "print([m for m in ('tensorflow', 'tensorflow_model_analysis') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- the evidence rule (paired, per record)


def right(count: int, wrong: set[int]) -> list[bool]:
    return [i not in wrong for i in range(count)]


def evidence(pairs: dict, decision: str = "evidence", confidence: float = 0.95) -> Evidence:
    return Evidence(decision, confidence, pairs)


# 175 eval records: the served version misses 3, the candidate 7 (4 more, none the served model gets right).
SERVED_RIGHT = right(175, {0, 1, 2})
CANDIDATE_RIGHT = right(175, {0, 1, 2, 3, 4, 5, 6})


def test_a_few_records_below_the_served_version_is_blessed_as_not_significant():
    decision = verdict(metrics(168 / 175), metrics(172 / 175), version=3,
                       evidence=evidence({3: (CANDIDATE_RIGHT, SERVED_RIGHT)}))
    assert decision.blessed and decision.reasons == []
    noise, small = decision.notes
    assert noise.startswith("accuracy 0.9600 is 0.0229 below the served version 3 (0.9829), 95% interval of the "
                            "difference [-0.05") and noise.endswith("McNemar's exact p = 0.12: not significant; blessed")
    assert small == ("175 eval images can only detect drops of about 0.04; gate.max_regression 0.01 is below what "
                     "this eval set can see: add eval data or raise ingest.eval_fraction")
    comparison = decision.comparison
    assert comparison["discordant"] == [0, 4] and comparison["difference"] == pytest.approx(-4 / 175)
    assert comparison["interval"][0] < -4 / 175 < 0 < comparison["interval"][1]
    assert comparison["decision"] == "evidence" and comparison["best_retained"] is None


def test_point_decision_keeps_todays_rule_and_wording():
    decision = verdict(metrics(168 / 175), metrics(172 / 175), version=3,
                       evidence=evidence({3: (CANDIDATE_RIGHT, SERVED_RIGHT)}, decision="point"))
    assert not decision.blessed and decision.reasons == [
        "accuracy 0.9600 is 0.0229 below the served version 3 (0.9829); allowed regression 0.01"]
    assert decision.notes == [] and decision.comparison["decision"] == "point"


def test_clearly_worse_is_refused_with_the_interval_and_p_value():
    worse = right(175, set(range(40)))  # wrong on 37 records the served version gets right
    decision = verdict(metrics(135 / 175), metrics(172 / 175), version=3, evidence=evidence({3: (worse, SERVED_RIGHT)}))
    (reason,) = decision.reasons
    lower, upper = decision.comparison["interval"]
    assert not decision.blessed and upper < -0.01 and decision.comparison["p_value"] < 1e-9
    assert reason == (f"accuracy 0.7714 is 0.2114 below the served version 3 (0.9829), 95% interval of the difference "
                      f"[{lower:+.3f}, {upper:+.3f}], McNemar's exact p = {decision.comparison['p_value']:.2g}: "
                      "worse by more than the allowed regression 0.01 with evidence")


def test_a_slow_slide_is_refused_against_the_best_retained_version():
    """Versions 1, 2, 3 each a little worse than the one before, each blessed as within noise; the
    fourth candidate is again only a little below version 3, but clearly below version 1."""
    versions = {1: right(400, set(range(4))), 2: right(400, set(range(14))), 3: right(400, set(range(24)))}
    candidate = right(400, set(range(34)))
    for version, below in ((2, 1), (3, 2)):  # how each served version was once blessed
        pair = {below: (versions[version], versions[below])}
        step = verdict(metrics(0.9), metrics(0.9), version=below, evidence=evidence(pair))
        assert step.blessed and "not significant; blessed" in step.notes[0]
    decision = verdict(metrics(366 / 400), metrics(376 / 400), version=3,
                       evidence=evidence({v: (candidate, versions[v]) for v in versions}))
    best = decision.comparison["best_retained"]
    assert best["version"] == 1 and best["difference"] == pytest.approx(-30 / 400) and best["interval"][1] < -0.01
    assert not decision.blessed and len(decision.reasons) == 1
    assert decision.reasons[0].startswith("accuracy 0.9150 is 0.0750 below version 1, the most accurate retained "
                                          "version on these records (0.9900), 95% interval of the difference [")
    assert any("below the served version 3" in note and "not significant; not a reason to refuse" in note
               for note in decision.notes)


def test_evidence_on_the_classes_both_know_names_them():
    served = right(10, set())
    decision = verdict(CANDIDATE, BASELINE, version=3, shared=SHARED, floor=WHITE,
                       evidence=evidence({3: (right(10, {0, 1, 2}), served)}))
    assert decision.blessed and decision.notes[0] == PER_CLASS
    assert decision.notes[1].startswith("on the 3 classes both models know, accuracy 0.7000 is 0.3000 below the "
                                        "served version 3 (1.0000)")


# The label-set rule, decided from the candidate's own label set (metrics.json) against the served
# version's lineage: labels.json plays no part, so moving it aside changes nothing.
from components.contracts.label_set import LabelSet  # noqa: E402
from components.gate.labelset import known_classes, label_set_reasons  # noqa: E402

SERVED_LABELS = LabelSet(["red", "green", "blue"])
GREY = ["red", "green", "blue", "grey"]
GREY_WHITE = [*GREY, "white"]


@pytest.mark.parametrize("served, candidate, known", [
    (SERVED_LABELS, ["red", "green", "blue"], ["red", "green", "blue"]),
    (SERVED_LABELS, ["red", "green", "blue", "white"], ["red", "green", "blue"]),
    # grey's span held back, white's let in: grey keeps its id, neither answers it
    (SERVED_LABELS, LabelSet(GREY_WHITE, ["grey"]), ["red", "green", "blue"]),
    (LabelSet(GREY_WHITE, ["grey"]), LabelSet(GREY_WHITE, ["grey"]), ["red", "green", "blue", "white"]),
    # grey's span released: compared on the classes both answer, which leave grey's id out
    (LabelSet(GREY_WHITE, ["grey"]), GREY_WHITE, ["red", "green", "blue", "white"]),
])
def test_a_candidate_answering_every_served_class_in_place_is_compared(served, candidate, known):
    candidate = candidate if isinstance(candidate, LabelSet) else LabelSet(candidate)
    assert known_classes(served, candidate) == known and label_set_reasons(served, candidate, 3) == []


@pytest.mark.parametrize("candidate, says", [
    (["red", "green"], "does not know blue"),                     # trained on span 1 only
    (["red"], "does not know green, blue"),
    (["red", "green", "white"], "does not know blue"),           # one swapped for another
    (["red", "blue", "green"], "another order"),                 # same classes, other ids
    (["white", "red", "green", "blue"], "another order"),        # a class prepended shifts every id
    ([], "does not know red, green, blue"),
    (LabelSet(GREY_WHITE, ["blue", "grey"]), "does not know blue"),  # keeps blue's id, no record of it
])
def test_a_candidate_that_drops_or_reorders_served_classes_is_refused_with_a_reason(candidate, says):
    candidate = candidate if isinstance(candidate, LabelSet) else LabelSet(candidate)
    assert known_classes(SERVED_LABELS, candidate) is None
    reasons = label_set_reasons(SERVED_LABELS, candidate, 3)
    assert len(reasons) == 1 and says in reasons[0] and "served version 3" in reasons[0]


def test_a_candidate_that_no_longer_answers_a_class_the_served_version_answers_is_refused():
    """Grey was released and is served; its span is held back again since (its manifest changed, say), while
    white's is let in: the candidate keeps grey's id without a record of it."""
    reasons = label_set_reasons(LabelSet(GREY_WHITE), LabelSet(GREY_WHITE, ["grey"]), 3)
    assert reasons == ["the candidate does not know grey, which the served version 3 answers: a new version must "
                       "keep every served class (were spans left out of training?)"]


def test_without_served_labels_there_is_nothing_to_refuse():
    assert known_classes(None, LabelSet(["red"])) == ["red"] and label_set_reasons(None, LabelSet(["red"]), 3) == []
    assert known_classes(None, LabelSet(GREY, ["grey"])) == ["red", "green", "blue"]


def test_a_refused_label_set_refuses_a_candidate_above_the_floor():
    # The reproduction: a 0.37 model that dropped a class, above a 0.34 floor, no baseline to compare.
    floor = Floor(0.34, False, "must beat 0.3400, the share of the most common class (red)", "red")
    reasons = label_set_reasons(SERVED_LABELS, LabelSet(["red", "green"]), 3)
    decision = decide(metrics(0.37), None, 3, None, floor, 0.01, SERVED, True, [], None, label_reasons=reasons)
    assert not decision.blessed and decision.reasons == reasons
