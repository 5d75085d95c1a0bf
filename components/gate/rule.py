"""The evidence rule of the gate (`gate.decision: evidence`, the default): a regression refuses only when it is real.

A drop of a few records on a small eval set is noise: the candidate is refused only when the whole
paired interval of (candidate minus served) lies below -max_regression, against the newest served
version or against the retained version most accurate on the same records (a slow slide of small,
insignificant drops still ends at a refusal). Pure: correctness lists in, words out.
"""
from __future__ import annotations

import dataclasses

from components.gate import evidence as stats

EPSILON = 1e-12


@dataclasses.dataclass(frozen=True)
class Reference:
    """The version whose recorded answers the candidate is held to class by class (reference.py), when it is
    not the newest served version, and the records both answered."""
    version: int
    pushed_at: str
    days: int  # from its push to this gate
    since: int  # versions pushed after it
    pair: tuple  # (candidate right, reference right, class id) lists (answers.paired)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Per-record correctness for the paired comparison, and the rule that weighs it."""
    decision: str  # "evidence" or "point" (the overall comparison is then recorded, not used; the per-class rule holds)
    confidence: float
    pairs: dict  # served version -> (candidate right, version right, class id) lists, on the records both know
    classes: list[str] | None = None  # class names by id: the per-class rule's (forgetting.py); None: off
    reference: Reference | None = None  # the per-class rule's second comparison; None: none beside the newest


def comparison(evidence: Evidence | None, served_version: int | None) -> dict | None:
    """gate.json's `comparison`: against the newest served version, plus the best retained one
    when another retained version is more accurate on these records. None without per-record data."""
    if evidence is None or served_version not in evidence.pairs:
        return None
    against = {version: {"version": version, **stats.compare(pair[0], pair[1], evidence.confidence)}
               for version, pair in evidence.pairs.items()}
    newest = against.pop(served_version)
    best = max(against.values(), key=lambda c: (c["baseline_accuracy"], c["version"]), default=None)
    if best is not None and best["baseline_accuracy"] <= newest["baseline_accuracy"]:
        best = None
    return {**newest, "decision": evidence.decision, "confidence": evidence.confidence, "best_retained": best}


def verdict(compared: dict, shared: list[str] | None, max_regression: float) -> tuple[list[str], list[str], list[str]]:
    """(reasons, noise, notes) of the evidence rule: a refusal carries its interval and p-value; a drop
    beyond the allowance within noise is `noise` (the caller adds the verdict); an eval set too small to
    see the allowance is a note."""
    where = f"on the {len(shared)} classes both models know, " if shared else ""
    level = f"{compared['confidence']:.0%}"
    reasons, noise, notes = [], [], []
    against = [(compared, f"the served version {compared['version']}")]
    if compared["best_retained"]:
        best = compared["best_retained"]
        against.append((best, f"version {best['version']}, the most accurate retained version on these records"))
    for c, whom in against:
        (lower, upper), drop = c["interval"], -c["difference"]
        said = (f"{where}accuracy {c['accuracy']:.4f} is {drop:.4f} below {whom} ({c['baseline_accuracy']:.4f}), "
                f"{level} interval of the difference [{lower:+.3f}, {upper:+.3f}], McNemar's exact p = {c['p_value']:.2g}")
        if upper < -max_regression - EPSILON:
            reasons.append(f"{said}: worse by more than the allowed regression {max_regression} with evidence")
        elif drop > max_regression + EPSILON:
            noise.append(f"{said}: not significant")
    if compared["detectable_difference"] > max_regression + EPSILON:
        notes.append(f"{compared['example_count']} eval images can only detect drops of about "
                     f"{compared['detectable_difference']:.2f}; gate.max_regression {max_regression} is below what "
                     "this eval set can see: add eval data or raise ingest.eval_fraction")
    return reasons, noise, notes
