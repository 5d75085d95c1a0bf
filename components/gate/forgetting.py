"""The gate's guard against forgetting: a class the candidate answers worse than the served version, with
evidence, refuses it.

A candidate warm-started from the served model and trained on new spans plus a replay sample can lose
a class that no longer arrives while its overall accuracy hardly moves: one class of ten is a tenth
of the records, so 20 of 20 falling to 10 of 20 costs 0.05 overall, and gains elsewhere hide it. So
the candidate and the newest served version are also compared class by class, on the same eval
records: for class k, b_k of its records only the candidate gets right, c_k only the served version.

- test: McNemar's exact test, one-sided (the alternative is that the candidate is worse): c_k
  successes of b_k + c_k at 1/2 (evidence.mcnemar_exact_worse). Exact, because a class's discordant
  records are a handful.
- multiplicity: Holm's step-down procedure (Holm 1979, Scand. J. Statist. 6:65-70) over the classes the
  served version knows that have eval records, at the gate's level 1 - gate.confidence: the chance that
  any class is called worse while none is stays below the level, for ten classes or a thousand, and
  without assuming the classes' tests independent (one model answers them all).
- materiality: a class counts only when its fall is also beyond gate.max_regression, the allowance
  the overall comparison has: with thousands of records a class, a fall of a fraction of a point is
  significant and still no reason to keep yesterday's model.

The rule is the same under either gate.decision: a point rule per class would refuse on one record of
a small class.

Each night is compared with the version it replaces, so a class that falls a little every night,
each fall within noise, would slide unseen. So the candidate is also held, with the same test and
threshold, to the reference (reference.py): a version that does not move with the nights, on the
records both answered. The two tables are each held to the gate's level, as the overall rule holds
the newest and the best retained versions: a candidate no worse than either is refused by chance at
most twice as often. Pure: class ids and correctness in, a table and words out.
"""
from __future__ import annotations

import collections
from collections.abc import Sequence

from components.gate import evidence as stats

METHOD = "McNemar exact test, one-sided, per class; Holm step-down over the classes"
EPSILON = 1e-12
SHOWN = 5  # classes named in the note on falls within noise; gate.json has them all


def compare(labels: Sequence[int], candidate: Sequence[bool], served: Sequence[bool], classes: Sequence[str],
            version: int, level: float, max_regression: float) -> dict:
    """gate.json's `comparison.per_class`: one row per class with eval records, in class-id order."""
    if not len(labels) == len(candidate) == len(served):
        raise ValueError(f"per-record lists differ in length: {len(labels)}, {len(candidate)} and {len(served)}")
    # (class id, candidate right, served right) -> records; per class, a b c d as in evidence.discordant
    tally = collections.Counter(zip(map(int, labels), map(bool, candidate), map(bool, served)))
    ids = sorted({k for k, _, _ in tally})
    cells = {k: (tally[k, True, True], tally[k, True, False], tally[k, False, True], tally[k, False, False]) for k in ids}
    p_values = [stats.mcnemar_exact_worse(cells[k][1], cells[k][2]) for k in ids]
    rows = []
    for k, p_value, (rejected, threshold) in zip(ids, p_values, stats.holm(p_values, level)):
        a, b, c, d = cells[k]
        n, right, baseline_right = a + b + c + d, a + b, a + c
        fell = (baseline_right - right) / n > max_regression + EPSILON
        rows.append({"label": classes[k], "example_count": n, "right": right, "baseline_right": baseline_right,
                     "discordant": [b, c], "p_value": p_value, "threshold": threshold,
                     "verdict": "held" if not fell else "worse" if rejected else "within noise"})
    return {"version": version, "method": METHOD, "level": level, "max_regression": max_regression, "classes": rows}


def with_reference(table: dict, pushed_at: str, days: int, versions_since: int) -> dict:
    """gate.json's `comparison.reference`: a table of compare() against the reference, and its age."""
    return {**table, "pushed_at": pushed_at, "days": days, "versions_since": versions_since}


def verdict(table: dict) -> tuple[list[str], list[str]]:
    """(reasons, notes): a reason for each class worse with evidence, with its figures; one note for the
    falls beyond the allowance that are within noise."""
    rows = table["classes"]
    family = f"{_count(len(rows), 'class')} at {table['level']:g}"
    whom, short = _against(table)
    reasons = []
    for r in rows:
        if r["verdict"] == "worse":
            n, (b, c) = r["example_count"], r["discordant"]
            reasons.append(
                f"class {r['label']} fell from {r['baseline_right']}/{n} right under {whom} "
                f"to {r['right']}/{n} ({c} of its records only {short} gets right, {b} only the "
                f"candidate): McNemar's exact one-sided p = {r['p_value']:.2g}, within Holm's threshold "
                f"{r['threshold']:.2g} for {family}; a fall beyond the allowed regression "
                f"{table['max_regression']:g} with evidence")
    noise = [r for r in rows if r["verdict"] == "within noise"]
    if not noise:
        return reasons, []
    named = ", ".join(f"{r['label']} {r['right']}/{r['example_count']} from {r['baseline_right']}/{r['example_count']} "
                      f"(p = {r['p_value']:.2g}, threshold {r['threshold']:.2g})" for r in noise[:SHOWN])
    key = "reference" if "pushed_at" in table else "per_class"
    more = f" and {len(noise) - SHOWN} more (gate.json's comparison.{key})" if len(noise) > SHOWN else ""
    return reasons, [f"per class against {whom}, {_count(len(noise), 'class')} fell beyond the "
                     f"allowed regression within noise (McNemar's exact one-sided test, Holm's step-down over "
                     f"{family}): {named}{more}"]


def _against(table: dict) -> tuple[str, str]:
    """Whom a table compares the candidate with, in full and in short: the served version, or the reference
    with how long ago it was pushed, in days and in versions (the nights a slide took)."""
    if "pushed_at" not in table:
        return f"the served version {table['version']}", "the served version"
    return (f"the reference version {table['version']} (pushed {table['pushed_at'][:10]}, "
            f"{_count(table['days'], 'day')} ago; {_count(table['versions_since'], 'version')} pushed since)",
            "the reference")


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{'es' if noun.endswith('s') else 's'}"
