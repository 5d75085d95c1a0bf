"""Suspected label errors: records whose given label the served model confidently contradicts, decided
without any I/O from the model's predicted probabilities.

Confident learning (Northcutt, Jiang and Chuang, "Confident Learning: Estimating Uncertainty in Dataset
Labels", JAIR 70:1373-1411, 2021), through cleanlab's `find_label_issues`, the authors' package. It needs
out-of-sample probabilities, which Stoke has for free: the served model was not trained on a span its
lineage does not name. In the paper's terms (section 3.1), with p_j(x) the probability of class j:

    t_j = mean of p_j(x) over the records x labelled j            (the class's expected self-confidence)
    C[i][j] = #{x labelled i : j = argmax of p_k(x) over the classes k with p_k(x) >= t_k}
                                                                  (the confident joint, calibrated so that
                                                                   each row sums to the records labelled i)

and prune by noise rate (section 3.2) flags, for each i != j, the C[i][j] records labelled i with the
largest margin p_j(x) - p_i(x); cleanlab then keeps those whose given label the model nearly predicts.

One change: a class that no record of the span is labelled with has no t_j to estimate, and cleanlab
makes it unreachable; then a span whose images all went into the wrong folder (an upload sorted into one
class wholesale) would hide its errors. Here such a class takes t_j = ABSENT_THRESHOLD: the model must
give it more than half of its probability.

How many flags are too many is decided on counts: an exact one-sided binomial test (scipy.stats.binomtest)
of the span's flagged records, over all and per given class, against the expected rate (Bonferroni over
the tests). Far above it is an error that quarantines the span; a few are warnings naming each file.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections import Counter

import numpy as np

from components.contracts.label_check import LabelCheck, LabelPair, SuspectedLabel
from components.contracts.summaries import DataAnomaly

ABSENT_THRESHOLD = 0.5
ALPHA = 1e-3  # a clean span is quarantined by chance about once in a thousand checks
# The expected rate is never taken below this: a history with no flag at all would make one flag
# "far above" it. Northcutt, Athalye and Mueller ("Pervasive Label Errors in Test Sets Destabilize
# Machine Learning Benchmarks", NeurIPS 2021 Datasets and Benchmarks) found 3.3% of the labels of ten
# common test sets wrong on average: a rate that careful labelling still leaves.
MIN_RATE = 0.03
EXAMPLES = 5


@dataclasses.dataclass
class Predictions:
    """The served model's view of a span's records: one row per record it could judge."""

    labels: list[str]  # the model's classes, index = column of `probabilities`
    files: list[str]  # each record's source URI
    splits: list[str]
    given: np.ndarray  # int, the index into `labels` of each record's label
    probabilities: np.ndarray  # float [records, classes]
    unknown: int = 0  # records not judged: a class the model does not know, or an image it cannot read


def thresholds(given: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """t_j: the mean probability of class j over the records labelled j; ABSENT_THRESHOLD where none is."""
    return np.array([probabilities[given == j, j].mean() if np.any(given == j) else ABSENT_THRESHOLD
                     for j in range(probabilities.shape[1])])


def unjudged(predictions: Predictions) -> str | None:
    """Why the served model's predictions cannot be judged, in words; None when they can: no record of a class
    it knows, or answers that are no probabilities (a model whose weights went to NaN)."""
    p, given = predictions.probabilities, predictions.given
    others = "the other checks judge the span"
    if not len(given):
        return (f"none of the span's records is of a class the served model answers ({predictions.unknown} of classes "
                f"it does not know, or that it could not read): {others}")
    broken = int(np.sum(~(np.isfinite(p).all(axis=1) & (p >= 0).all(axis=1) & (p.sum(axis=1) > 0))))
    if broken:
        return (f"the served model's answers on {broken} of {len(given)} records are not probabilities (NaN, infinite, "
                f"negative or all zero): nothing it says is evidence; {others}")
    return None


def suspects(given: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """A boolean mask of the records confident learning flags (prune by noise rate)."""
    if len(given) < 2:
        return np.zeros(len(given), dtype=bool)
    if len(set(given.tolist())) == 1:
        # A night of one class: cleanlab takes labels of a single class only when it is class 0 (its multi-label
        # case), and confident learning treats the classes alike, so the span's class trades places with class 0.
        swap = np.arange(probabilities.shape[1])
        swap[[0, given[0]]] = swap[[given[0], 0]]
        given, probabilities = np.zeros_like(given), probabilities[:, swap]
    from cleanlab.count import compute_confident_joint
    from cleanlab.filter import find_label_issues

    probabilities = probabilities / probabilities.sum(axis=1, keepdims=True)
    with warnings.catch_warnings():  # "may not flag all label issues in class k": said per span, in the docs
        warnings.simplefilter("ignore")
        joint = compute_confident_joint(given, probabilities, thresholds=thresholds(given, probabilities))
        # n_jobs=1: no process pool forked from a process that holds TensorFlow's threads
        return find_label_issues(given, probabilities, confident_joint=joint, filter_by="prune_by_noise_rate",
                                 n_jobs=1)


def expected_rate(history: list[LabelCheck], model_error: float | None) -> tuple[float, str]:
    """The flag rate a clean span would show, and where it comes from: the spans checked before, pooled;
    before any, the served model's error on its eval split; never below MIN_RATE."""
    done = [h for h in history if h.status == "done" and h.checked]
    if done:
        flagged, checked = sum(h.flagged for h in done), sum(h.checked for h in done)
        rate, where = flagged / checked, f"the history's: {flagged} of {checked} records flagged"
    elif model_error is not None:
        rate, where = model_error, "the served model's error on its eval split, no span checked before"
    else:
        rate, where = 0.0, "nothing to go by"
    if rate < MIN_RATE:
        return MIN_RATE, f"the floor, above {where} ({rate:.1%})"
    return rate, where


def rate_test(flags: np.ndarray, given: np.ndarray, names: list[str], rate: float) -> tuple[float, str]:
    """The smallest Bonferroni-adjusted p-value of the one-sided exact binomial tests of the flags, over
    all records and per given class, against `rate`; and what it tested."""
    from scipy.stats import binomtest

    groups = [("the span", flags)] + [(f"class {names[j]!r}", flags[given == j]) for j in sorted(set(given.tolist()))]
    tests = [(binomtest(int(g.sum()), len(g), rate, alternative="greater").pvalue, where, int(g.sum()), len(g))
             for where, g in groups if len(g)]
    p, where, k, n = min(tests)
    return min(1.0, p * len(tests)), f"{k} of {n} records of {where}"


def judge(predictions: Predictions, history: list[LabelCheck], model_error: float | None,
          model: str) -> tuple[list[DataAnomaly], LabelCheck]:
    """The findings of the label check (one per flagged file, and one about the span) and its record; or
    none, and the record of a skipped check, when the predictions cannot be judged."""
    why = unjudged(predictions)
    if why:
        return [], LabelCheck(status="skipped", reason=why, model=model, unknown=predictions.unknown)
    p, given, names = predictions.probabilities, predictions.given, predictions.labels
    flags = suspects(given, p)
    rate, where = expected_rate(history, model_error)
    check = LabelCheck(status="done", model=model, checked=len(given), unknown=predictions.unknown,
                       flagged=int(flags.sum()), expected_rate=round(rate, 4), expected_from=where)
    if not flags.any():
        return [], check
    adjusted, tested = rate_test(flags, given, names, rate)
    severity = "error" if adjusted < ALPHA else "warning"
    predicted = p.argmax(axis=1)
    order = sorted(np.flatnonzero(flags), key=lambda i: -p[i, predicted[i]])
    files = [DataAnomaly(
        kind="label_error", severity=severity, file=predictions.files[i],
        message=f"labelled {names[given[i]]!r}, the served model says {names[predicted[i]]!r} ({p[i, predicted[i]]:.0%})",
        label=SuspectedLabel(given=names[given[i]], predicted=names[predicted[i]],
                             confidence=round(float(p[i, predicted[i]]), 4),
                             given_probability=round(float(p[i, given[i]]), 4), split=predictions.splits[i]))
        for i in order]
    pairs = Counter((f.label.given, f.label.predicted) for f in files)
    check.pairs = [LabelPair(given=g, predicted=q, count=n) for (g, q), n in sorted(pairs.items(), key=lambda x: -x[1])]
    check.p_value = float(f"{adjusted:.3g}")
    share = flags.sum() / len(flags)
    verdict = (f"far above the expected {rate:.1%} ({where}; exact binomial test over {tested}: p = {adjusted:.2g} "
               f"< {ALPHA:g}): was a class relabelled, or a folder sorted into another?" if severity == "error" else
               f"within chance of the expected {rate:.1%} (p = {adjusted:.2g}): look at the files named")
    span = DataAnomaly(
        kind="label_error", severity=severity, count=len(files), examples=[f.file for f in files[:EXAMPLES]],
        message=f"{len(files)} of {len(flags)} records ({share:.0%}) look mislabelled to the served model ("
                + ", ".join(f"{pair.count} {pair.given!r} -> {pair.predicted!r}" for pair in check.pairs[:3])
                + (", ..." if len(check.pairs) > 3 else "") + f"), {verdict}")
    return [span, *files], check
