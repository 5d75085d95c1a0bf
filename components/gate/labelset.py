"""The label-set rule of the gate: a candidate replaces the served version only if it answers every
class the served version answers, with the same class ids.

Labels are append-only, so a candidate's labels start with the served version's; it may add classes
at the end (it is then compared on the classes both know). A candidate that lacks a served class
(trained on fewer spans, labels.json moved aside, a class renamed) or holds them in another order
(every id a client receives would change meaning) is refused, whatever its accuracy: the decision
reads the candidate's own labels (its metrics.json) and the served version's lineage, never
labels.json. Pure: label lists in, words out.
"""
from __future__ import annotations


def known_classes(served: list[str] | None, candidate: list[str]) -> list[str] | None:
    """The candidate's classes the served version knows (a prefix of the candidate's), or None when the
    candidate drops or reorders served classes. A served version without recorded labels knows all."""
    served, candidate = (list(served) if served else None), list(candidate)
    if served is None or served == candidate:
        return candidate
    if len(served) < len(candidate) and candidate[:len(served)] == served:
        return served
    return None


def label_set_reasons(served: list[str] | None, candidate: list[str], version: int | None) -> list[str]:
    """Why the candidate may not replace served `version` for its labels alone; [] when it may."""
    if known_classes(served, candidate) is not None:
        return []
    missing = [name for name in served if name not in candidate]
    if missing:
        return [f"the candidate does not know {', '.join(missing)}, which the served version {version} answers: "
                "a new version must keep every served class (were spans left out of training?)"]
    return [f"the candidate holds the served version {version}'s classes in another order ({', '.join(candidate)} "
            f"for {', '.join(served)}): the class ids clients receive would change meaning"]
