"""The gate's paired statistics against published values and exact computations: no model, no TFMA."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, norm

from components.gate import evidence


def test_newcombe_interval_matches_the_published_example():
    # Fagerland, Lydersen and Laake, Statistical Analysis of Contingency Tables (2017), ch. 8: complete
    # response before and after consolidation therapy (Cavo et al. 2012), table [[59, 6], [16, 80]];
    # Newcombe's square-and-add interval: estimate -0.0621, 95% CI -0.1186 to -0.0046 (also the R
    # package contingencytables' test-ch8.R).
    lower, upper = evidence.newcombe_paired(59, 6, 16, 80, 0.95)
    assert (round(lower, 4), round(upper, 4)) == (-0.1186, -0.0046)


def test_mcnemar_exact_is_the_two_sided_binomial_tail():
    # Same table: b = 6, c = 16; the exact conditional McNemar p-value is 0.0525 (ibid.): twice the
    # lower tail of Binomial(22, 1/2) at 6.
    tail = sum(math.comb(22, k) for k in range(7)) / 2 ** 22
    assert evidence.mcnemar_exact(6, 16) == pytest.approx(2 * tail) == pytest.approx(0.0525, abs=1e-4)
    assert evidence.mcnemar_exact(0, 0) == 1.0


def test_interval_stays_honest_without_discordant_pairs_of_one_kind():
    # 175 records, the candidate wrong on 4 the served model gets right and right on none it misses:
    # the interval still includes small drops and reaches above 0 (a Wald interval would not).
    lower, upper = evidence.newcombe_paired(165, 0, 4, 6, 0.95)
    assert -0.06 < lower < -4 / 175 < upper and upper > 0
    assert evidence.newcombe_paired(170, 0, 0, 5)[0] < 0 < evidence.newcombe_paired(170, 0, 0, 5)[1]


def mcnemar_power(n: int, discordance: float, delta: float, confidence: float = 0.95) -> float:
    """Exact power of McNemar's (asymptotic) test, enumerated: k ~ Binomial(n, psi) discordant pairs, of
    which b ~ Binomial(k, (psi + delta) / (2 psi)) favour the first model; reject when |b - c| / sqrt(k) > z."""
    z = norm.ppf(0.5 + confidence / 2)
    power = 0.0
    for k in range(1, n + 1):
        b = np.arange(k + 1)
        reject = np.abs(2 * b - k) / math.sqrt(k) > z
        power += binom.pmf(k, n, discordance) * binom.pmf(b, k, (discordance + delta) / (2 * discordance))[reject].sum()
    return power


@pytest.mark.parametrize("n, discordance", [(1000, 0.1), (500, 0.2)])
def test_detectable_difference_has_the_promised_power(n, discordance):
    # Connor's formula solved for the difference; enumerating the test's exact power there gives 80%.
    delta = evidence.detectable_difference(n, discordance, 0.95)
    assert mcnemar_power(n, discordance, delta) == pytest.approx(0.8, abs=0.015)
    # Connor's sample size, put back together, is n.
    z_a, z_b = norm.ppf(0.975), norm.ppf(0.8)
    assert (z_a * math.sqrt(discordance) + z_b * math.sqrt(discordance - delta ** 2)) ** 2 / delta ** 2 == pytest.approx(n)


def test_175_digits_cannot_see_a_one_point_drop():
    # The demo's eval split: 175 images, about 4% of them answered differently by two good models.
    assert 0.04 < evidence.detectable_difference(175, 0.04) < 0.05
    assert evidence.detectable_difference(175, 0.0) == pytest.approx(evidence.detectable_difference(175, 0.04))
    assert evidence.detectable_difference(20_000, 0.04) < 0.01


def test_compare_counts_pairs_in_order():
    candidate = [True, True, False, False, True]
    served = [True, False, True, True, True]
    result = evidence.compare(candidate, served)
    assert result["discordant"] == [1, 2] and result["example_count"] == 5
    assert result["difference"] == pytest.approx(-0.2) and result["accuracy"] == 0.6 and result["baseline_accuracy"] == 0.8
    assert result["interval"][0] < -0.2 < result["interval"][1] and result["p_value"] == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        evidence.compare([True], [True, False])
