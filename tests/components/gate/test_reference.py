"""The reference a candidate is held to class by class, beside the newest served version: on figures through
the gate's decision (answers as lists, no model, no TFMA, no TensorFlow)."""
from __future__ import annotations

import gzip
import random

import pytest

from components.contracts.results import ResultError
from components.gate import answers
from components.gate.decision import Floor, decide
from components.gate.rule import Evidence, Reference

SERVED = {"ok": True, "problems": [], "real_server": {"status": "passed"}}
CLASSES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
FLOOR = Floor(0.0, True, "gate.min_accuracy", None)
PER, KEEP = 30, 3  # eval records a class; push.keep, the versions the repository retains
LABELS = [k for k in range(len(CLASSES)) for _ in range(PER)]
KEYS = [f"{i:064x}" for i in range(len(LABELS))]  # each record's SHA-256, as the gate keys them


def answered(right: list[bool]) -> list[int]:
    """A model's class for each record: its label when right, the next class when wrong."""
    return [label if ok else (label + 1) % len(CLASSES) for label, ok in zip(LABELS, right)]


def gated(candidate: list[bool], retained: dict[int, list[bool]], reference: Reference | None):
    """The gate's decision on a candidate, against the retained versions (the newest is served) and the reference."""
    pairs = {version: (candidate, right, LABELS) for version, right in retained.items()}
    newest = max(retained)
    return decide({"accuracy": sum(candidate) / len(candidate), "confusion_matrix": None},
                  {"accuracy": sum(retained[newest]) / len(LABELS)}, newest, None, FLOOR, 0.01, SERVED, True, [],
                  Evidence("evidence", 0.95, pairs, CLASSES, reference))


def held_to(version: int, recorded, candidate: list[bool], night: int, since: int) -> Reference:
    """The reference `version`, pushed on night 1 (2026-11-28) with `recorded` answers, on night `night`."""
    return Reference(version, "2026-11-28T02:00:00Z", night - 1, since,
                     answers.paired(recorded, KEYS, LABELS, answered(candidate)))


def slide(right: list[bool]) -> list[bool]:
    """One night of a slow slide: 3 more records of class zero wrong, 3 records of other classes right."""
    candidate = list(right)
    for i in [i for i, k in enumerate(LABELS) if k == 0 and candidate[i]][:3]:
        candidate[i] = False
    for i in [i for i, k in enumerate(LABELS) if k != 0 and not candidate[i]][:3]:
        candidate[i] = True
    return candidate


def test_a_class_sliding_a_little_each_night_is_refused_against_the_reference():
    """Each night 3 of class zero's 30 records fall (McNemar's one-sided p = 1/8 against the version it
    replaces: within noise) while overall accuracy holds. Held to version 1's recorded answers too, the
    third night's candidate, 16/30 against 25/30 (9 records of 9, p = 1/512 within Holm's 0.05/10), is refused."""
    right = [i % PER < 25 for i in range(len(LABELS))]  # version 1: 25 of 30 in every class
    recorded = answers.record(KEYS, LABELS, answered(right), CLASSES)  # at version 1's gate
    retained, night = {1: right}, 1
    while night < 13:
        night += 1
        candidate = slide(retained[max(retained)])
        served = gated(candidate, retained, held_to(1, recorded, candidate, night, max(retained) - 1))
        newest = next(row for row in served.comparison["per_class"]["classes"] if row["label"] == "zero")
        assert newest["verdict"] == "within noise" and newest["p_value"] == 0.125  # night by night, nothing to see
        assert sum(candidate) == sum(right)
        if not served.blessed:
            break
        retained = dict(sorted({**retained, max(retained) + 1: candidate}.items())[-KEEP:])
    assert night == 4 and served.reasons == [
        "class zero fell from 25/30 right under the reference version 1 (pushed 2026-11-28, 3 days ago; 2 versions "
        "pushed since) to 16/30 (9 of its records only the reference gets right, 0 only the candidate): McNemar's "
        "exact one-sided p = 0.002, within Holm's threshold 0.005 for 10 classes at 0.05; a fall beyond the "
        "allowed regression 0.01 with evidence"]
    table = served.comparison["reference"]
    assert (table["version"], table["pushed_at"], table["days"], table["versions_since"]) == (
        1, "2026-11-28T02:00:00Z", 3, 2)
    zero = table["classes"][0]
    assert zero == {"label": "zero", "example_count": 30, "right": 16, "baseline_right": 25, "discordant": [0, 9],
                    "p_value": 0.5 ** 9, "threshold": pytest.approx(0.005), "verdict": "worse"}
    # Without the reference the same candidate is blessed: the rule it adds is what refuses.
    assert gated(candidate, retained, None).blessed
    # The first night, blessed, with the slide named as a fall within noise against the reference.
    candidate = slide(right)
    first = gated(candidate, {1: right}, held_to(1, recorded, candidate, 2, 0))
    assert first.blessed and any(note.startswith("per class against the reference version 1 (pushed 2026-11-28, "
                                                 "1 day ago; 0 versions pushed since), 1 class fell") and
                                 "zero 22/30 from 25/30 (p = 0.12" in note for note in first.notes), first.notes


def test_a_genuine_improvement_is_blessed():
    right = [i % PER < 25 for i in range(len(LABELS))]
    recorded = answers.record(KEYS, LABELS, answered(right), CLASSES)
    served = [i % PER < 24 for i in range(len(LABELS))]  # a night slightly worse everywhere, within noise
    candidate = [i % PER < 28 for i in range(len(LABELS))]  # better than both in every class
    result = gated(candidate, {1: right, 2: served}, held_to(1, recorded, candidate, 5, 1))
    assert result.blessed and result.reasons == []
    assert {row["verdict"] for row in result.comparison["reference"]["classes"]} == {"held"}
    assert not any("fell beyond" in note for note in result.notes)


def noisy(right: list[bool], rng: random.Random) -> list[bool]:
    """Another night of as good a model: in each class a few records it got right are wrong and as many it
    got wrong are right, chosen at random."""
    night = list(right)
    for k in range(len(CLASSES)):
        mine = [i for i, label in enumerate(LABELS) if label == k]
        flips = rng.randint(0, 3)
        for i in rng.sample([i for i in mine if night[i]], flips) + rng.sample([i for i in mine if not night[i]], flips):
            night[i] = not night[i]
    return night


def test_an_ordinary_noisy_night_is_blessed():
    """Records flip both ways in every class, against the served version and the reference alike."""
    rng = random.Random(11)
    right = [rng.random() < 0.85 for _ in LABELS]
    recorded = answers.record(KEYS, LABELS, answered(right), CLASSES)
    served = noisy(right, rng)
    candidate = noisy(served, rng)
    result = gated(candidate, {1: right, 2: served}, held_to(1, recorded, candidate, 3, 1))
    assert result.blessed, result.reasons
    rows = result.comparison["reference"]["classes"]
    assert sum(row["example_count"] for row in rows) == len(LABELS)
    assert sum(row["discordant"][0] > 0 and row["discordant"][1] > 0 for row in rows) >= 3  # noise both ways


def test_only_the_records_both_answered_under_the_same_label_are_paired():
    recorded = answers.record(["a", "b", "c", "d"], [0, 1, 1, 2], [0, 1, 0, 2], ["red", "green", "blue"])
    # b was relabelled blue since; e is a record the reference never answered; the last holds the same image as a.
    candidate, earlier, labels = answers.paired(recorded, ["a", "b", "c", "d", "e", "a"], [0, 2, 1, 2, 0, 0],
                                                [1, 2, 1, 2, 0, 1])
    assert (candidate, earlier, labels) == ([False, True, True, False], [True, False, True, True], [0, 1, 2, 0])
    assert answers.decode(answers.encode(recorded), "answers.json.gz") == recorded


def test_a_record_that_is_not_one_is_one_line_naming_it():
    with pytest.raises(ResultError, match="^x/answers.json.gz is not gzip"):
        answers.decode(b"{}", "x/answers.json.gz")
    with pytest.raises(ResultError, match="^x/answers.json.gz is not a valid Answers: records"):
        answers.decode(gzip.compress(b'{"labels": ["red"], "records": {"a": [0]}}'), "x/answers.json.gz")
    with pytest.raises(ValueError, match="differ in length"):
        answers.record(["a"], [0, 1], [0], ["red"])
