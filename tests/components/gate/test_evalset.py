"""Which eval records the gate judges a candidate on: every span the data check lets in, whichever of
them training read. A stand-in run (metrics.json and an empty SavedModel file) is enough: the gate
chooses its records before it loads any model."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

from components.common.files import write_json
from components.common.spans import SpanNotChecked
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig
from components.gate import gate
from components.gate.evalset import eval_spans
from tests.components.conftest import TRAIN_LABELS, tiny_image, tiny_records, write_span
from tests.components.gate.test_gate_faults import quarantine

SAMPLE = pathlib.Path(__file__).parents[1] / "contracts" / "samples" / "metrics.json"
VIOLET = [*TRAIN_LABELS, "violet"]


@pytest.fixture(scope="module")
def checked_root(tmp_path_factory) -> str:
    """Spans 1-3 checked (3, 4 and 5 eval records), 4 quarantined, 5 checked with a class added since (violet,
    one eval record), 6 checked with two class ids swapped (by hand: ingest never reorders labels), 7 checked
    with violet among its manifest's labels and no violet record (published after violet's span was)."""
    root = str(tmp_path_factory.mktemp("evalset") / "root")
    for number, evals in ((1, 3), (2, 4), (3, 5), (4, 6)):
        write_span(root, number, {"train": tiny_records(3, offset=100 * number),
                                  "eval": tiny_records(evals, offset=100 * number + 50)},
                   TRAIN_LABELS, {"train": 1, "eval": 1})
    quarantine(root, 4)
    write_span(root, 5, {"train": tiny_records(3, offset=500), "eval": tiny_records(2, offset=550) + [
        (tiny_image(2, 590), "jpeg", 3)]}, VIOLET, {"train": 1, "eval": 1})
    write_span(root, 6, {"eval": tiny_records(2, offset=650)}, ["green", "red", "blue", "violet"], {"eval": 1})
    write_span(root, 7, {"eval": tiny_records(2, offset=750)}, VIOLET, {"eval": 1})
    return root


def stand_in_run(root: str, run_id: str, spans: list[int]) -> None:
    run = Root(root).run(run_id)
    metrics = json.loads(SAMPLE.read_text())
    write_json(run.metrics, {**metrics, "run_id": run_id, "spans": spans, "labels": TRAIN_LABELS})
    os.makedirs(run.candidate)
    open(os.path.join(run.candidate, "saved_model.pb"), "wb").close()


def test_every_checked_span_is_gated_on_whichever_training_read(checked_root):
    """What a span's records carry counts, not what its manifest lists: span 7 lists violet and carries none."""
    ids = ("span 6 is left out of the eval records: its class ids are not the candidate's; the next run trains and "
           "gates on it")
    assert eval_spans(Root(checked_root), [3], LabelSet(TRAIN_LABELS)) == ([1, 2, 3, 7], [
        "span 5 is left out of the eval records: it brings classes the candidate was not trained on (violet); "
        "the next run trains and gates on it", ids])
    # A candidate that knows violet is judged on span 5 too; the quarantined span 4 is never read, and
    # span 6, whose ids say green is 0, is no evidence for a candidate whose 0 is red.
    assert eval_spans(Root(checked_root), [5], LabelSet(VIOLET)) == ([1, 2, 3, 5, 7], [ids])
    # One that keeps violet's id without a record of it (violet's span held back when it trained) never answers it.
    assert eval_spans(Root(checked_root), [3], LabelSet(VIOLET, ["violet"]))[0] == [1, 2, 3, 7]


def test_a_trained_span_quarantined_since_still_refuses(checked_root):
    with pytest.raises(SpanNotChecked, match="span 4 is quarantined"):
        eval_spans(Root(checked_root), [3, 4], LabelSet(TRAIN_LABELS))


def test_a_candidate_that_names_only_the_newest_span_is_gated_on_all_checked_spans(checked_root):
    """A warm-started run trains on the newest span and a replay sample: its metrics.json names span 3
    alone, and the gate still reads the eval records of spans 1, 2, 3 and 7."""
    stand_in_run(checked_root, "warm", [3])
    inputs = gate.gather(RunConfig(root=checked_root), "warm")
    assert inputs.spans == [1, 2, 3, 7] and sorted({s.span for s in inputs.shards}) == [1, 2, 3, 7]
    assert sum(inputs.counts.values()) == 3 + 4 + 5 + 2 and inputs.floor.total == 14
    assert any(note.startswith("span 5 is left out of the eval records") for note in inputs.served.notes)
