"""The label-set rule of the gate: a candidate replaces the served version only if it answers every
class the served version answers, with the same class ids.

Labels are append-only, so a candidate's labels start with the served version's; it may add classes
at the end (it is then compared on the classes both answer). A candidate that lacks a served class
(trained on fewer spans, labels.json moved aside, a class renamed), keeps its id without answering it
(no record of the spans it trained on carries it) or holds the classes in another order (every id a
client receives would change meaning) is refused, whatever its accuracy: the decision reads the
candidate's own label set (its metrics.json) and the served version's lineage, never labels.json. A
class the served version keeps an id for without answering it is one the candidate may add. Pure: label
sets in, words out.
"""
from __future__ import annotations

from components.contracts.label_set import LabelSet


def known_classes(served: LabelSet | None, candidate: LabelSet) -> list[str] | None:
    """The classes both answer (every class the served version answers), or None when the candidate drops,
    reorders or no longer answers a served class. A served version without recorded labels answers all the
    candidate does."""
    if served is None:
        return candidate.answered
    if candidate.labels[:len(served.labels)] != served.labels or not set(served.answered) <= set(candidate.answered):
        return None
    return served.answered


def label_set_reasons(served: LabelSet | None, candidate: LabelSet, version: int | None) -> list[str]:
    """Why the candidate may not replace served `version` for its labels alone; [] when it may."""
    if known_classes(served, candidate) is not None:
        return []
    missing = [name for name in served.answered if name not in candidate.answered]
    if missing:
        return [f"the candidate does not know {', '.join(missing)}, which the served version {version} answers: "
                "a new version must keep every served class (were spans left out of training?)"]
    return [f"the candidate holds the served version {version}'s classes in another order "
            f"({', '.join(candidate.labels)} for {', '.join(served.labels)}): the class ids clients receive would "
            "change meaning"]
