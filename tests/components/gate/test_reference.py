"""The reference a candidate is held to class by class, beside the newest served version: on figures through
the gate's decision (answers as lists, no model, no TFMA, no TensorFlow), and which version it is on a model
repository laid out by hand."""
from __future__ import annotations

import gzip
import json
import os
import posixpath
import random
from pathlib import Path

import pytest

from components.common.files import exists
from components.common.repository import ANSWERS_FILE, ASSETS_EXTRA, LINEAGE_FILE, Repository
from components.contracts.label_set import LabelSet
from components.contracts.results import GateReference, ResultError
from components.gate import answers, correctness, gate, reference
from components.gate.decision import Floor, decide
from components.gate.rule import Evidence, Reference
from components.push import rollback
from components.push.push import reference_after
from tests.components.conftest import fake_model

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


# ---------------------------------------------------------------- which version is the reference


SAMPLE = Path(__file__).parents[1] / "contracts" / "samples" / "stoke_lineage.json"
COLOURS = ["red", "green", "blue"]
NOW = "2026-12-31T12:00:00Z"  # when the gates below run
RECORDS = {"red": ["r1", "r2"], "green": ["g1", "g2"], "blue": ["b1", "b2"], "white": ["w1", "w2"]}


def recorded_answers(labels: list[str]) -> bytes:
    """A version's answers to the eval records of its classes: all right."""
    keys = [key for name in labels for key in RECORDS[name]]
    ids = [labels.index(name) for name in labels for _ in RECORDS[name]]
    return answers.encode(answers.record(keys, ids, ids, labels))


def push(repo: Repository, source: str, version: int, kind: str, labels: list[str] = COLOURS,
         recorded: bool = True) -> None:
    """A push as the gate and push make it: the gate chooses the reference from the newest served version's
    lineage, the push records the one later candidates are held to, and retention keeps push.keep versions."""
    newest = repo.newest()
    chosen = reference.choose(repo, newest, repo.lineage(newest), LabelSet(labels), NOW) if newest is not None else None
    held = GateReference(version=chosen.version, kept=kind == "warm") if chosen and chosen.version else None
    lineage = json.loads(SAMPLE.read_text()) | {
        "version": version, "pushed_at": f"2026-12-{version % 100:02d}T02:00:00Z", "labels": labels,
        "rolled_back": None, "reference": reference_after(held, version, recorded)}
    extra = {f"{ASSETS_EXTRA}/{LINEAGE_FILE}": json.dumps(lineage).encode()}
    if recorded:
        extra[f"{ASSETS_EXTRA}/{ANSWERS_FILE}"] = recorded_answers(labels)
    with repo.lock("push"):
        repo.publish(source, version, extra)
        repo.apply_retention(KEEP, "2026-12-31T00:00:00Z")


def held(repo: Repository, labels: list[str] = COLOURS) -> reference.Chosen:
    """The reference the next candidate is held to."""
    newest = repo.newest()
    return reference.choose(repo, newest, repo.lineage(newest), LabelSet(labels), NOW)


@pytest.fixture
def repo(tmp_path) -> tuple[Repository, str]:
    return Repository(str(tmp_path / "root"), "stoke"), fake_model(tmp_path / "model")


def test_warm_nights_keep_the_reference_and_a_retired_reference_keeps_its_answers(repo):
    warm_nights_and_retirement(*repo)


def test_on_a_bucket_a_retired_reference_keeps_its_answers_too(s3_bucket, tmp_path):
    warm_nights_and_retirement(Repository(f"s3://{s3_bucket}/root", "stoke"), fake_model(tmp_path / "model"))


def warm_nights_and_retirement(repo: Repository, source: str) -> None:
    push(repo, source, 101, "full")
    for version in (102, 103, 104, 105):
        push(repo, source, version, "warm")
    assert repo.versions() == [103, 104, 105] and repo.retired() == [101, 102]
    chosen = held(repo)
    assert (chosen.version, chosen.pushed_at, chosen.days, chosen.since, chosen.notes) == (
        101, "2026-12-01T02:00:00Z", 30, 4, [])
    assert chosen.recorded == answers.decode(recorded_answers(COLOURS), "")
    assert repo.answers_uri(101).endswith("/_retired/101.answers.json.gz")
    assert not exists(repo.answers_uri(102))  # no kept version is held to 102: its answers went with it
    # A full retrain, held to 101 at its gate, is the reference once pushed; 101's answers stay while a kept
    # version is held to it, and go once none is.
    push(repo, source, 106, "full")
    assert held(repo).version == 106 and held(repo).recorded is None  # the newest served version, answered anew
    assert exists(repo.answers_uri(101))
    push(repo, source, 107, "warm")
    push(repo, source, 108, "warm")
    assert repo.versions() == [106, 107, 108] and held(repo).version == 106
    retired = sorted(posixpath.basename(p) for p in repo.fs.ls(posixpath.join(repo.path, "_retired"), detail=False))
    assert retired == [f"{v}.json" for v in range(101, 106)]


def test_after_a_rollback_the_reference_is_the_one_the_served_version_was_held_to(repo):
    repo, source = repo
    push(repo, source, 101, "full")
    push(repo, source, 102, "warm")
    push(repo, source, 103, "full")
    push(repo, source, 104, "warm")
    assert held(repo).version == 103
    rollback.rollback(repo.root.uri, "stoke", reason="canary errors")
    assert held(repo).version == 103 and held(repo).recorded is None  # 103 is served again
    rollback.rollback(repo.root.uri, "stoke", reason="still wrong")
    chosen = held(repo)  # 102 is served, held to 101: 103, rolled back, is no reference
    assert chosen.version == 101 and chosen.recorded is not None and chosen.since == 3
    # A lineage naming a rolled-back version (written by hand) does not make it one.
    lineage = repo.lineage(102).model_copy(update={"reference": 103})
    with open(repo.lineage_uri(102), "w") as f:
        json.dump(lineage.to_json(), f)
    chosen = held(repo)
    assert (chosen.version, chosen.recorded) == (102, None) and chosen.notes == [
        "the reference version 103 was rolled back: class by class the candidate is compared with the served "
        "version 102 alone, the reference from now on"]


def test_after_a_released_new_class_the_full_retrain_is_the_reference(repo):
    repo, source = repo
    push(repo, source, 101, "full")
    push(repo, source, 102, "warm")
    wider = [*COLOURS, "white"]
    chosen = held(repo, wider)  # the candidate that learnt white is held to 101 on the classes 101 knew
    assert chosen.version == 101
    candidate, earlier, labels = answers.paired(chosen.recorded, [k for n in wider for k in RECORDS[n]],
                                                [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 1, 1, 2, 2, 3, 3])
    assert labels == [0, 0, 1, 1, 2, 2] and all(candidate) and all(earlier)
    push(repo, source, 103, "full", wider)  # a new class retrains fully
    push(repo, source, 104, "warm", wider)
    chosen = held(repo, wider)
    assert chosen.version == 103 and chosen.recorded.labels == wider


def test_a_served_version_without_recorded_answers_is_compared_alone(repo):
    """A ROOT whose versions were pushed before the gate recorded answers: the gate works as it did, says so
    once, and the next version pushed is the reference."""
    repo, source = repo
    push(repo, source, 101, "full", recorded=False)
    push(repo, source, 102, "warm", recorded=False)
    assert repo.lineage(102).reference is None
    chosen = held(repo)
    assert (chosen.version, chosen.recorded) == (None, None) and chosen.notes == [
        "served version 102 has no recorded answers, so class by class the candidate is compared with it alone; "
        "once pushed, it is the reference later candidates are held to"]
    # What the gate says of it: that note, once, and no comparison beside the newest served version's.
    served = gate._served(repo, LabelSet(COLOURS))
    compared, notes = gate._reference_pair(served.held_to, correctness.Answered(["r1"], [0], [0]))
    assert compared is None and [n for n in served.notes + notes if "recorded answers" in n] == chosen.notes
    push(repo, source, 103, "warm")
    push(repo, source, 104, "warm")
    assert held(repo).version == 103 and held(repo).recorded is not None


@pytest.mark.parametrize("damage, says", [
    ("removed", "has no recorded answers or lineage left"),
    ("other classes", "answered other classes than the candidate's (green, red, blue)"),
])
def test_a_reference_whose_answers_are_gone_hands_over_to_the_served_version(repo, damage, says):
    repo, source = repo
    push(repo, source, 101, "full")
    push(repo, source, 102, "warm")
    uri = repo.answers_uri(101)
    if damage == "removed":
        os.remove(uri)
    else:
        with open(uri, "wb") as f:
            f.write(recorded_answers(["green", "red", "blue"]))
    chosen = held(repo)
    assert (chosen.version, chosen.recorded) == (102, None)
    assert chosen.notes[0].startswith(f"the reference version 101 {says}") and chosen.notes[0].endswith(
        "class by class the candidate is compared with the served version 102 alone, the reference from now on")
    push(repo, source, 103, "warm")  # the warm night after is held to 102
    assert held(repo).version == 102 and held(repo).recorded is not None


def test_a_damaged_record_of_the_reference_is_one_line_naming_it(repo):
    repo, source = repo
    push(repo, source, 101, "full")
    push(repo, source, 102, "warm")
    with open(repo.answers_uri(101), "wb") as f:
        f.write(b"not gzip")
    with pytest.raises(ResultError, match=r"/101/assets.extra/stoke_answers.json.gz is not gzip"):
        held(repo)
    with open(repo.answers_uri(101), "wb") as f:
        f.write(recorded_answers(COLOURS))
    lineage = repo.lineage(101).model_copy(update={"pushed_at": "last Tuesday"})
    with open(repo.lineage_uri(101), "w") as f:
        json.dump(lineage.to_json(), f)
    with pytest.raises(ResultError, match=r"/101/assets.extra/stoke_lineage.json says the version was pushed at "
                                          r"'last Tuesday', which is no time as Stoke writes them"):
        held(repo)
