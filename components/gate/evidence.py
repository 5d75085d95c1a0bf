"""Paired evidence for the gate: is the candidate worse than a served model, beyond noise?

Both models answer the SAME eval records, so each record is a pair (candidate right?, served
right?). Only the discordant pairs carry information about the difference: b records the candidate
gets right and the served model wrong, c the reverse; difference = (b - c) / n. Plain functions on
counts and correctness lists: no TensorFlow, no files.

- p-value: McNemar's exact test, a two-sided binomial test of b out of b + c at 1/2. Exact because
  b + c is often a handful of records when both models are good.
- interval: Newcombe's hybrid score interval for paired proportions ("method 10", Newcombe 1998,
  Statistics in Medicine 17:2635), in the form Fagerland, Lydersen and Laake (Statistical Analysis
  of Contingency Tables, 2017, ch. 8) recommend. It squares and adds the two Wilson score intervals
  and corrects for the pairing with the correlation of the two accuracies, so it stays inside
  [-1, 1], keeps its coverage on small samples and does not collapse to zero width when b or c is 0
  (the Wald interval does exactly that, and a paired bootstrap has nothing to resample there).
- detectable difference: Connor's (1987, Biometrics 43:207) sample size for McNemar's test, solved
  for the difference: what n records can detect at the chosen level with 80% power.
- per class (forgetting.py): McNemar's exact test one-sided, and Holm's (1979, Scand. J. Statist.
  6:65) step-down procedure over the classes.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

METHOD = "McNemar exact test; Newcombe hybrid score interval (paired, method 10)"
POWER = 0.8


def discordant(candidate: Sequence[bool], served: Sequence[bool]) -> tuple[int, int, int, int]:
    """(a, b, c, d): both right, only the candidate right, only the served model right, both wrong."""
    if len(candidate) != len(served):
        raise ValueError(f"paired lists differ in length: {len(candidate)} and {len(served)}")
    pairs = list(zip(map(bool, candidate), map(bool, served)))
    return (pairs.count((True, True)), pairs.count((True, False)), pairs.count((False, True)),
            pairs.count((False, False)))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact p-value of McNemar's test: b successes of b + c trials at 1/2."""
    from scipy.stats import binomtest

    return 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5).pvalue)


def mcnemar_exact_worse(b: int, c: int) -> float:
    """One-sided exact p-value of McNemar's test against "the candidate is worse": at least c successes of
    b + c trials at 1/2 (the exact conditional test; Fagerland, Lydersen and Laake 2013, BMC Medical
    Research Methodology 13:91, give its one-sided form as the binomial tail, the two-sided as twice it)."""
    from scipy.stats import binomtest

    return 1.0 if b + c == 0 else float(binomtest(c, b + c, 0.5, alternative="greater").pvalue)


def holm(p_values: Sequence[float], level: float) -> list[tuple[bool, float]]:
    """Holm's step-down procedure (Holm 1979, "A simple sequentially rejective multiple test procedure"):
    (rejected, threshold) for each p-value, in the order given. The i-th smallest of m is held to
    level / (m - i + 1); the hypotheses are rejected in that order until the first that misses its
    threshold, and none after it. The chance of rejecting any true hypothesis stays at most `level`
    whatever the tests' dependence, and it rejects everything Bonferroni's level / m does, and more."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])  # stable: ties keep their order
    out: list[tuple[bool, float]] = [(False, level)] * len(p_values)
    rejecting = True
    for rank, i in enumerate(order):
        threshold = level / (len(p_values) - rank)
        rejecting = rejecting and p_values[i] <= threshold
        out[i] = (rejecting, threshold)
    return out


def wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    """Wilson's score interval for one proportion."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_paired(a: int, b: int, c: int, d: int, confidence: float = 0.95) -> tuple[float, float]:
    """Interval for p1 - p2 = (b - c) / n, with p1 = (a + b) / n (first model right) and p2 = (a + c) / n."""
    n = a + b + c + d
    if n == 0:
        return -1.0, 1.0
    z = _z(confidence)
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    # Newcombe's correlation of the two proportions, continuity-corrected when positive.
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > n / 2 else cross) / math.sqrt(margins)
    difference = p1 - p2
    lower = difference - math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)))
    upper = difference + math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)))
    return max(-1.0, lower), min(1.0, upper)


def detectable_difference(n: int, discordance: float, confidence: float = 0.95, power: float = POWER) -> float:
    """The smallest |difference| McNemar's test detects on n pairs at `confidence` (two-sided) with
    `power`: Connor's n = (z_a sqrt(psi) + z_b sqrt(psi - delta^2))^2 / delta^2 solved for delta,
    psi the discordance rate (b + c) / n. A difference needs at least as many discordant pairs as
    itself, so psi is never taken below delta (a sample without discordant pairs still has a limit)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if n <= 0:
        return 1.0
    z_a, z_b = _z(confidence), float(norm.ppf(power))

    def shortfall(delta: float) -> float:
        psi = max(discordance, delta)
        return math.sqrt(n) * delta - z_a * math.sqrt(psi) - z_b * math.sqrt(max(0.0, psi - delta * delta))

    if shortfall(1.0) < 0:
        return 1.0
    return float(brentq(shortfall, 1e-12, 1.0, xtol=1e-10))


def compare(candidate: Sequence[bool], served: Sequence[bool], confidence: float = 0.95) -> dict:
    """Candidate minus served on the same records: accuracies, difference, interval, p-value."""
    a, b, c, d = discordant(candidate, served)
    n = a + b + c + d
    lower, upper = newcombe_paired(a, b, c, d, confidence)
    return {"example_count": n, "accuracy": (a + b) / n if n else 0.0, "baseline_accuracy": (a + c) / n if n else 0.0,
            "difference": (b - c) / n if n else 0.0, "interval": [lower, upper], "p_value": mcnemar_exact(b, c),
            "method": METHOD, "discordant": [b, c],
            "detectable_difference": detectable_difference(n, (b + c) / n if n else 0.0, confidence)}


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))
