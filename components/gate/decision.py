"""The gate's decision: blessed or not, and why, from the metrics and per-record correctness alone (no
file, no model, no TFMA, no TensorFlow), so every rule is tested on figures written by hand.

A candidate must reach the floor (gate.min_accuracy, or beat always answering the eval split's most
common class), decided on counts of records; under `decision: evidence` a drop below the served
version refuses only when the paired interval shows it (rule.py, evidence.py); under `point` the
accuracies are compared as they are. Under either, a class that falls below the served version, or
below the reference (reference.py), with evidence refuses (forgetting.py). The label-set rule's and
the serving check's problems refuse whatever the accuracy.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from components.gate import forgetting, rule


@dataclasses.dataclass(frozen=True)
class Floor:
    """The accuracy a candidate must reach: gate.min_accuracy, or more than the most common class's share."""
    value: float
    inclusive: bool  # min_accuracy is met at equality; the majority share must be beaten
    source: str
    majority_label: str | None  # the most common class when it sets the floor, else None
    majority_count: int | None = None  # its eval records, when the floor is the majority share
    total: int | None = None  # eval records


class Decision(NamedTuple):
    """The verdict and its grounds, as gate.json reports them."""
    blessed: bool
    reasons: list[str]
    notes: list[str]  # what the decision adds to the notes of the baseline resolution
    shared_classes: dict | None
    comparison: dict | None = None  # the paired comparison (gate.json's `comparison`)


def decide(candidate: dict, baseline: dict | None, served_version: int | None, shared: list[str] | None,
           floor: Floor, max_regression: float, serving: dict, validation_ok: bool,
           validation_failures: list[str], evidence: rule.Evidence | None = None,
           label_reasons: list[str] = ()) -> Decision:
    """Blessed or not, and why, from the metrics and per-record correctness alone: no file, no model,
    no TFMA. Without `evidence`, or under `gate.decision: point`, the accuracies are compared as they are.
    `label_reasons` (labelset.label_set_reasons) refuse whatever the accuracy."""
    reasons, notes, noise = [*label_reasons, *_floor_reasons(candidate, floor)], [], []
    shared_classes = shared_comparison(candidate, baseline, shared) if baseline is not None and shared else None
    compared = rule.comparison(evidence, served_version) if baseline is not None else None
    if compared is not None and compared["decision"] == "evidence":
        more, noise, said = rule.verdict(compared, shared, max_regression)
        reasons += more
    else:
        reasons += _point_reasons(candidate["accuracy"], baseline, shared_classes, served_version, max_regression)
        said = []
    if compared is not None and evidence.classes is not None:
        level = 1 - evidence.confidence
        candidate_right, served_right, labels = evidence.pairs[served_version]
        compared["per_class"] = forgetting.compare(labels, candidate_right, served_right, evidence.classes,
                                                   served_version, level, max_regression)
        tables = [compared["per_class"]]
        if evidence.reference is not None:
            held = evidence.reference
            candidate_right, reference_right, labels = held.pair
            compared["reference"] = forgetting.with_reference(
                forgetting.compare(labels, candidate_right, reference_right, evidence.classes, held.version, level,
                                   max_regression), held.pushed_at, held.days, held.since)
            tables.append(compared["reference"])
        for table in tables:
            more, fell = forgetting.verdict(table)
            reasons += more
            said += fell
    if shared_classes is not None:
        notes.append("per class, candidate vs served: " + ", ".join(
            f"{name} {value:.4f} vs {shared_classes['baseline_per_class_accuracy'][name]:.4f}"
            for name, value in shared_classes["per_class_accuracy"].items()))
    reasons += [f"serving check: {problem}" for problem in serving["problems"]]
    if not validation_ok and not reasons:
        reasons.append("TFMA's validation failed: " + "; ".join(validation_failures))
    notes += [f"{line}; {'not a reason to refuse' if reasons else 'blessed'}" for line in noise] + said
    if serving.get("real_server", {}).get("status") == "skipped":
        notes.append(f"real TF Serving check skipped: {serving['real_server']['reason']}")
    return Decision(not reasons, reasons, notes, shared_classes, compared)


def _floor_reasons(candidate: dict, floor: Floor) -> list[str]:
    """Whether the candidate reaches the floor, decided on counts: TFMA reports accuracy in float32, so 6 of
    15 right is 0.4000000059604645, which a float comparison finds above the 0.4 that always answering a
    class with 6 of the 15 records scores; a tie is not a win. Without counts, float32 against float32."""
    accuracy, correct = candidate["accuracy"], correct_count(candidate)
    if correct is not None and floor.total:
        reached = (correct > floor.majority_count if floor.majority_count is not None
                   else Fraction(correct, floor.total) >= Fraction(repr(floor.value)))
        said = f"accuracy {accuracy:.4f} ({correct} of {floor.total} right)"
    else:
        reached = (np.float32(accuracy) >= np.float32(floor.value) if floor.inclusive
                   else np.float32(accuracy) > np.float32(floor.value))
        said = f"accuracy {accuracy:.4f}"
    if reached:
        return []
    if floor.majority_label is None:
        return [f"{said} is below the required {floor.value:.4f} (gate.min_accuracy)"]
    return [f"{said} does not beat {floor.value:.4f}"
            + (f" ({floor.majority_count} of {floor.total})" if floor.majority_count is not None else "")
            + f", what always answering the most common class ({floor.majority_label}) scores on the eval split"]


# A model answers one class "for most" records when that class takes this share of its answers and
# this much more than the class's share of the records: a model answering as the data is has not collapsed.
COLLAPSE_SHARE, COLLAPSE_EXCESS = 0.8, 0.2


def collapse(metrics: dict, labels: list[str]) -> dict | None:
    """The class a candidate answers for most eval records beyond its share (GateResult.collapse), else None."""
    matrix = metrics.get("confusion_matrix")
    if not matrix or len(labels) < 2:
        return None
    answered = [sum(row[j] for row in matrix) for j in range(len(matrix))]
    total, top = sum(answered), max(range(len(answered)), key=answered.__getitem__)
    actual = sum(matrix[top])
    if not total or answered[top] < COLLAPSE_SHARE * total or answered[top] - actual <= COLLAPSE_EXCESS * total:
        return None
    return {"label": labels[top], "answered": answered[top], "actual": actual, "example_count": total}


def correct_count(metrics: dict) -> int | None:
    """Eval records the model got right, from its confusion matrix (whole records); None without one."""
    matrix = metrics.get("confusion_matrix")
    return sum(row[i] for i, row in enumerate(matrix)) if matrix else None


def _point_reasons(accuracy: float, baseline: dict | None, shared_classes: dict | None, served_version: int | None,
                   max_regression: float) -> list[str]:
    """`gate.decision: point`: the accuracies as they are, at most `gate.max_regression` apart."""
    if shared_classes is not None:
        drop = shared_classes["baseline_accuracy"] - shared_classes["accuracy"]
        if drop > max_regression + 1e-9:
            return [f"on the {len(shared_classes['classes'])} classes both models know, accuracy "
                    f"{shared_classes['accuracy']:.4f} is {drop:.4f} below the served version {served_version} "
                    f"({shared_classes['baseline_accuracy']:.4f}); allowed regression {max_regression}"]
    elif baseline is not None:
        drop = baseline["accuracy"] - accuracy
        if drop > max_regression + 1e-9:
            return [f"accuracy {accuracy:.4f} is {drop:.4f} below the served version {served_version} "
                    f"({baseline['accuracy']:.4f}); allowed regression {max_regression}"]
    return []


def shared_comparison(candidate: dict, baseline: dict, classes: list[str]) -> dict:
    """Both models' accuracy on the records of `classes` alone, weighted from TFMA's per-class slices
    (a candidate that answers a new class for one of them is wrong there, as it would be in serving)."""
    counts = {name: candidate["per_class_examples"].get(name, 0) for name in classes}
    seen = [name for name in classes if counts[name]]
    total = sum(counts.values())

    def restricted(model: dict) -> float:
        return sum(model["per_class_accuracy"].get(name, 0.0) * counts[name] for name in seen) / max(total, 1)

    return {"classes": classes, "example_count": total, "accuracy": restricted(candidate),
            "baseline_accuracy": restricted(baseline),
            "per_class_accuracy": {name: candidate["per_class_accuracy"].get(name, 0.0) for name in seen},
            "baseline_per_class_accuracy": {name: baseline["per_class_accuracy"].get(name, 0.0) for name in seen}}
