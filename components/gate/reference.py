"""The reference: the version whose recorded answers a candidate is held to class by class, beside the newest
served version, so that a class falling a little every night, each fall within noise, ends in a refusal.

Each pushed version names its reference in its lineage (`reference`), and a gate takes the newest served
version's. It moves only this way:
- a full retrain, once pushed, is the reference (a new class, a span released after the data check held
  it, such as a relabelled class, a new network or image size and train.full_every bring one:
  components/train/warm.py). It was held to the reference before it at its own gate, so a reference
  never hands over a class that fell beyond noise;
- a warm run keeps the reference it was held to: the nights that drift from it stay held to it;
- a rollback serves an earlier version again, and with it the reference that version named before the
  rolled-back one existed: a rolled-back version is never a reference;
- a reference the repository retires stays the reference: its recorded answers are kept in `_retired/`
  while a kept version names it (components/common/repository.py).
Only the records the reference answered under the label they hold now are compared with it
(answers.py): a relabelled record, or a span published since, is not. The comparison is forgetting.py's:
McNemar's exact one-sided test per class, Holm's (1979) step-down over the classes, at the gate's level,
beyond gate.max_regression. A served version without recorded answers (pushed before the gate recorded
them) leaves the candidate compared with it alone, and the candidate, once pushed, is the reference.
"""
from __future__ import annotations

import dataclasses

from components.common import clock
from components.common.files import exists, read_bytes
from components.common.repository import Repository
from components.contracts.label_set import LabelSet
from components.contracts.lineage import Lineage
from components.contracts.results import Answers, ResultError
from components.gate import answers
from components.gate.labelset import known_classes


@dataclasses.dataclass(frozen=True)
class Chosen:
    """The reference a candidate is held to, and what the gate says of it."""
    version: int | None  # None: none
    # Its recorded answers, when and how many versions ago it was pushed; the answers are None when the reference is
    # the newest served version, which the gate answers anew.
    recorded: Answers | None = None
    pushed_at: str | None = None
    days: int = 0  # from its push to the gate
    since: int = 0  # versions pushed after it
    notes: list[str] = dataclasses.field(default_factory=list)


def choose(repo: Repository, newest: int, lineage: Lineage | None, candidate: LabelSet, now: str) -> Chosen:
    """The reference for a candidate of the label set `candidate`, gated at `now`, from the lineage of the newest served
    version."""
    if lineage is None or lineage.reference is None:
        return Chosen(None, notes=[
            f"served version {newest} has no recorded answers, so class by class the candidate is compared with it "
            "alone; once pushed, it is the reference later candidates are held to"])
    version = lineage.reference
    if version == newest:
        return Chosen(newest)
    recorded, why = _recorded(repo, version, candidate)
    if recorded is None:
        return Chosen(newest, notes=[
            f"the reference version {version} {why}: class by class the candidate is compared with the served "
            f"version {newest} alone, the reference from now on"])
    pushed_at = repo.lineage(version).pushed_at
    pushed = set(repo.versions() + repo.rolled_back() + repo.retired())
    return Chosen(version, recorded, pushed_at, _days(repo, version, pushed_at, now), sum(v > version for v in pushed))


def _days(repo: Repository, version: int, pushed_at: str, now: str) -> int:
    """Whole days from the push of `version` to `now`; a lineage whose time is none is one line naming it."""
    try:
        return clock.days_between(pushed_at, now)
    except ValueError:
        raise ResultError(f"{repo.lineage_uri(version)} says the version was pushed at {pushed_at!r}, "
                          "which is no time as Stoke writes them") from None


def _recorded(repo: Repository, version: int, candidate: LabelSet) -> tuple[Answers | None, str]:
    """The recorded answers of reference `version`, or None and why it cannot be one."""
    if version in repo.rolled_back():
        return None, "was rolled back"
    uri = repo.answers_uri(version)
    if not exists(uri) or repo.lineage(version) is None:  # retirement keeps both while a version names it
        return None, f"has no recorded answers or lineage left ({uri})"
    recorded = answers.decode(read_bytes(uri), uri)
    if known_classes(LabelSet(recorded.labels, repo.lineage(version).untrained), candidate) is None:
        return None, f"answered other classes than the candidate's ({', '.join(recorded.labels)})"
    return recorded, ""
