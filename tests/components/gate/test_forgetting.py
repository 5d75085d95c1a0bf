"""The guard against forgetting, on exact counts: plain lists of labels and correctness, no model, no
TFMA, no TensorFlow. The statistics against published values and the definitions they shortcut."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from components.gate import evidence, forgetting
from components.gate.decision import Floor, decide
from components.gate.rule import Evidence

SERVED = {"ok": True, "problems": [], "real_server": {"status": "passed"}}
CLASSES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
FLOOR = Floor(0.1, False, "must beat 0.1000, the share of the most common class (zero) in the eval split", "zero")


# ---------------------------------------------------------------- the statistics


def test_one_sided_mcnemar_is_the_published_exact_conditional_tail():
    # Fagerland, Lydersen and Laake 2013 (BMC Medical Research Methodology 13:91), Table 1: airway
    # hyper-responsiveness before and after stem cell transplantation in 21 children (Bentur et al.
    # 2009), discordant pairs 1 and 7. Their one-sided exact conditional p-value is the binomial tail
    # P(X <= 1 | 8, 1/2) = 9/256 = 0.0352, the two-sided twice it, 0.070.
    assert evidence.mcnemar_exact_worse(1, 7) == pytest.approx(9 / 256) == pytest.approx(0.0352, abs=1e-4)
    assert evidence.mcnemar_exact(1, 7) == pytest.approx(0.0703, abs=1e-4)
    # Fagerland, Lydersen and Laake (2017), ch. 8: discordant pairs 6 and 16, two-sided 0.0525, so 0.02625 one-sided.
    assert evidence.mcnemar_exact_worse(6, 16) == pytest.approx(evidence.mcnemar_exact(6, 16) / 2)
    assert evidence.mcnemar_exact_worse(6, 16) == pytest.approx(0.0525 / 2, abs=1e-4)


def test_one_sided_mcnemar_looks_only_for_a_worse_candidate():
    assert evidence.mcnemar_exact_worse(0, 10) == 0.5 ** 10  # all ten discordant records favour the served model
    assert evidence.mcnemar_exact_worse(7, 1) == pytest.approx(255 / 256)  # a better candidate is no evidence
    assert evidence.mcnemar_exact_worse(3, 3) > 0.5 and evidence.mcnemar_exact_worse(0, 0) == 1.0


def test_holm_on_the_textbook_example():
    # The worked example of the Holm-Bonferroni method (Wikipedia's article, also GeeksforGeeks'):
    # four hypotheses, p = 0.01, 0.04, 0.03, 0.005 at 0.05. 0.005 <= 0.05/4 rejects H4, 0.01 <= 0.05/3
    # rejects H1, 0.03 > 0.05/2 stops: H3 and H2 are kept, though 0.04 <= 0.05/1.
    result = evidence.holm([0.01, 0.04, 0.03, 0.005], 0.05)
    assert [rejected for rejected, _ in result] == [True, False, False, True]
    assert [threshold for _, threshold in result] == pytest.approx([0.05 / 3, 0.05, 0.05 / 2, 0.05 / 4])


def closed_bonferroni(p_values: list[float], level: float) -> list[bool]:
    """Holm's procedure by its definition (Holm 1979, section 3): the closed test of Bonferroni tests.
    H_i is rejected when every intersection of hypotheses containing it is rejected by Bonferroni."""
    m = len(p_values)
    return [all(min(p_values[j] for j in subset) <= level / len(subset)
                for size in range(1, m + 1) for subset in itertools.combinations(range(m), size) if i in subset)
            for i in range(m)]


def test_holm_is_the_closed_bonferroni_test():
    rng = random.Random(7)
    for _ in range(300):
        m = rng.randint(1, 7)
        p_values = [rng.choice([rng.random() * 0.06, rng.random(), 0.05 / rng.randint(1, m)]) for _ in range(m)]
        assert [r for r, _ in evidence.holm(p_values, 0.05)] == closed_bonferroni(p_values, 0.05), p_values


# ---------------------------------------------------------------- the rule, on exact counts


def ten_classes(fallen_right: int) -> tuple[list[int], list[bool], list[bool]]:
    """20 eval records of each of ten classes. The served model gets class zero 20/20 and the others
    16/20; the candidate gets zero `fallen_right`/20 and the others 17/20 (one record more each)."""
    labels, candidate, served = [], [], []
    for k in range(10):
        labels += [k] * 20
        served += [i >= 0 if k == 0 else i >= 4 for i in range(20)]
        candidate += [i >= 20 - fallen_right if k == 0 else i >= 3 for i in range(20)]
    return labels, candidate, served


def accuracy(right: list[bool]) -> dict:
    return {"accuracy": sum(right) / len(right), "per_class_accuracy": {}, "per_class_examples": {}}


def gated(labels, candidate, served, *, decision="evidence", classes=CLASSES, max_regression=0.01):
    pairs = {3: (candidate, served, labels)}
    return decide(accuracy(candidate), accuracy(served), 3, None, FLOOR, max_regression, SERVED, True, [],
                  Evidence(decision, 0.95, pairs, classes))


@pytest.mark.parametrize("decision", ["evidence", "point"])
def test_a_forgotten_class_refuses_while_overall_accuracy_holds(decision):
    labels, candidate, served = ten_classes(10)
    assert (sum(served), sum(candidate)) == (164, 163)  # 0.005 below overall: within the allowed 0.01
    result = gated(labels, candidate, served, decision=decision)
    assert not result.blessed
    assert result.reasons == [
        "class zero fell from 20/20 right under the served version 3 to 10/20 (10 of its records only the served "
        "version gets right, 0 only the candidate): McNemar's exact one-sided p = 0.00098, within Holm's threshold "
        "0.005 for 10 classes at 0.05; a fall beyond the allowed regression 0.01 with evidence"]
    table = result.comparison["per_class"]
    assert table["version"] == 3 and table["level"] == pytest.approx(0.05) and table["max_regression"] == 0.01
    zero, *others = table["classes"]
    assert zero == {"label": "zero", "example_count": 20, "right": 10, "baseline_right": 20, "discordant": [0, 10],
                    "p_value": 0.5 ** 10, "threshold": pytest.approx(0.005), "verdict": "worse"}
    assert [row["label"] for row in others] == CLASSES[1:]
    assert all(row["verdict"] == "held" and row["discordant"] == [1, 0] and row["p_value"] == 1.0 for row in others)
    # The overall comparison saw nothing: one class of ten is a tenth of the records.
    assert result.comparison["discordant"] == [9, 10] and result.comparison["p_value"] == 1.0
    # Without the per-class rule the same candidate passes.
    assert gated(labels, candidate, served, decision=decision, classes=None).blessed


def test_a_fall_that_is_not_significant_after_correction_is_blessed_with_a_note():
    labels, candidate, served = ten_classes(15)
    result = gated(labels, candidate, served)
    zero = result.comparison["per_class"]["classes"][0]
    # 5 of 5 discordant records against the candidate: p = 1/32, significant alone at 0.05 but not
    # against Holm's 0.05/10 for the smallest of ten.
    assert zero["p_value"] == 0.5 ** 5 < 0.05 and zero["verdict"] == "within noise"
    assert result.blessed and result.reasons == []
    assert result.notes[-1:] == ["per class against the served version 3, 1 class fell beyond the allowed regression "
                            "within noise (McNemar's exact one-sided test, Holm's step-down over 10 classes at 0.05): "
                            "zero 15/20 from 20/20 (p = 0.031, threshold 0.005)"]


def test_a_significant_fall_within_the_allowance_is_no_reason():
    """2,000 records of one class: 15 more wrong is p = 3e-05, and 0.0075 of the class, within max_regression."""
    labels, served = [0] * 2000 + [1] * 20, [True] * 2020
    candidate = [i >= 15 for i in range(2000)] + [True] * 20
    result = gated(labels, candidate, served)
    row = result.comparison["per_class"]["classes"][0]
    assert row["p_value"] < 1e-4 and row["verdict"] == "held" and result.blessed
    stricter = gated(labels, candidate, served, max_regression=0.005)
    assert stricter.comparison["per_class"]["classes"][0]["verdict"] == "worse" and not stricter.blessed


def test_the_family_is_the_classes_with_eval_records_and_two_can_fall():
    """Holm steps down: the second smallest p-value is held to 0.05/2 of the two classes compared."""
    labels = [0] * 10 + [1] * 7
    served = [True] * 17
    candidate = [False] * 10 + [False] * 6 + [True]  # class 0: p = 1/1024; class 1: p = 1/64
    result = gated(labels, candidate, served, classes=["red", "green", "blue"])
    red, green = result.comparison["per_class"]["classes"]
    assert (red["threshold"], green["threshold"]) == (pytest.approx(0.025), pytest.approx(0.05))
    assert red["verdict"] == green["verdict"] == "worse"
    fell = [r for r in result.reasons if r.startswith("class ")]
    assert [r.split(" fell")[0] for r in fell] == ["class red", "class green"]
    assert "p = 0.016, within Holm's threshold 0.05 for 2 classes at 0.05" in fell[1]


def test_many_falls_within_noise_are_named_five_at_most():
    labels = [k for k in range(8) for _ in range(4)]
    served = [True] * 32
    candidate = [i % 4 != 0 for i in range(32)]  # each class 3/4 from 4/4: p = 1/2
    note = gated(labels, candidate, served).notes[-1]
    assert note.startswith("per class against the served version 3, 8 classes fell")
    assert note.count(" from 4/4 ") == 5 and note.endswith("and 3 more (gate.json's comparison.per_class)")


def test_lists_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        forgetting.compare([0, 1], [True], [True, False], CLASSES, 3, 0.05, 0.01)


def test_the_counts_add_up_to_the_overall_comparison():
    rng = random.Random(3)
    labels = [rng.randrange(10) for _ in range(500)]
    candidate = [rng.random() < 0.8 for _ in labels]
    served = [rng.random() < 0.85 for _ in labels]
    result = gated(labels, candidate, served)
    rows = result.comparison["per_class"]["classes"]
    assert sum(r["example_count"] for r in rows) == 500
    assert [sum(r["discordant"][i] for r in rows) for i in (0, 1)] == result.comparison["discordant"]
    assert sum(r["right"] for r in rows) == sum(candidate) and sum(r["baseline_right"] for r in rows) == sum(served)
    assert all(math.isclose(r["p_value"], evidence.mcnemar_exact_worse(*r["discordant"])) for r in rows)
