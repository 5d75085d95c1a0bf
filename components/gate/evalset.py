"""The records the gate judges a candidate on: the eval split of every span the data check lets in.

A blessed candidate answers for everything the served model answers for, so it is judged on the eval
records of every checked span, whichever of them its training read: a run that trains on the new
spans and a replay sample of the old ones must still show that it kept the old ones' classes. Two
limits, both about what a candidate can be held to:
- a span the run trained on must still be let in: if the data check quarantined it since, the
  candidate learned from records no longer trusted, and the gate refuses (with how to release it);
- a span whose records carry a class the candidate does not answer (published after its training
  read the spans, or let in after it) is left out, with a note: no model is judged on a class it was
  never given, and the next run trains and gates on it. What counts is what the records carry
  (components/common/span_labels.py), not the labels a manifest lists: those of a span published after
  one the data check held back name the held span's classes too.
"""
from __future__ import annotations

from components.common.span_labels import span_classes
from components.common.spans import Spans
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root


def eval_spans(root: Root, trained: list[int], labels: LabelSet) -> tuple[list[int], list[str]]:
    """The spans whose eval records judge a candidate trained on `trained` with the label set `labels`, and a
    note for each checked span left out. Raises SpanNotChecked when a span of `trained` is not let in now."""
    for _ in Spans(root).each_manifest(trained, sources=False):
        pass  # each trained span is checked as it is read
    spans, notes = [], []
    for manifest in Spans(root).each_manifest(sources=False):
        carried = span_classes(root, manifest)
        unknown = [name for name in manifest.labels if name in carried and name not in labels.answered]
        shared = min(len(manifest.labels), len(labels.labels))
        if not unknown and manifest.labels[:shared] == labels.labels[:shared]:
            spans.append(manifest.span)
            continue
        why = (f"it brings classes the candidate was not trained on ({', '.join(unknown)})" if unknown else
               "its class ids are not the candidate's")
        notes.append(f"span {manifest.span} is left out of the eval records: {why}; the next run trains and gates on it")
    return spans, notes
