"""The label set of a model trained on spans: label ids up to the highest one their records carry, named by
their manifests. labels.json, to which ingest appends a class before the data check holds its span back,
plays no part; an id below the highest that none of the records carries (a held span's class, followed by
a class a span let in brought) keeps its place, since ids are indexes, and is never answered."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from components.common.span_labels import label_set
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root
from components.contracts.results import ResultError
from components.datacheck.span_status import release
from tests.components.conftest import TRAIN_LABELS, tiny_image, tiny_records, write_span
from tests.components.gate.test_gate_faults import quarantine

GREY = [*TRAIN_LABELS, "grey"]
WHITE = [*GREY, "white"]


def of(colour: int, label: int, count: int, offset: int) -> list[tuple[bytes, str, int]]:
    return [(tiny_image(colour, offset + i), "jpeg", label) for i in range(count)]


@pytest.fixture
def held_then_let_in(tmp_path) -> str:
    """Span 1 of red, green and blue; span 2 brings grey (id 3) and is held back; span 3, let in, brings none
    (its manifest lists grey: ingest gave it the labels of the time); span 4, let in, brings white (id 4)."""
    root = str(tmp_path / "root")
    write_span(root, 1, {"train": tiny_records(6), "eval": tiny_records(3, offset=50)}, TRAIN_LABELS,
               {"train": 1, "eval": 1})
    write_span(root, 2, {"train": of(0, 3, 4, 200) + tiny_records(3, offset=250)}, GREY, {"train": 1})
    quarantine(root, 2)
    write_span(root, 3, {"train": tiny_records(6, offset=300), "eval": tiny_records(3, offset=350)}, GREY,
               {"train": 1, "eval": 1})
    return root


def test_a_held_span_s_new_class_is_no_class_of_a_model_until_it_is_released(held_then_let_in):
    root = held_then_let_in
    assert json.load(open(Root(root).labels)) == GREY  # ingest named grey before the check held its span
    assert label_set(root) == LabelSet(TRAIN_LABELS) and label_set(root).answered == TRAIN_LABELS
    release(Root(root), 2, by="ops")
    assert label_set(root) == LabelSet(GREY)


def test_a_held_class_below_a_let_in_one_keeps_its_id_and_is_never_answered(held_then_let_in):
    root = held_then_let_in
    write_span(root, 4, {"train": of(1, 4, 4, 400) + tiny_records(3, offset=450)}, WHITE, {"train": 1})
    found = label_set(root)
    assert found == LabelSet(WHITE, untrained=["grey"]) and found.answered == [*TRAIN_LABELS, "white"]
    assert label_set(root, [1, 3]) == LabelSet(TRAIN_LABELS)  # train.spans: the spans named, no more
    release(Root(root), 2, by="ops")
    assert label_set(root) == LabelSet(WHITE)


@pytest.mark.parametrize("damage", ["missing", "another span's", "not statistics"])
def test_statistics_that_do_not_describe_the_span_are_read_past_to_its_records(held_then_let_in, damage):
    root = held_then_let_in
    write_span(root, 4, {"train": of(1, 4, 4, 400)}, WHITE, {"train": 1})
    mine = Root(root).statistics(4, "train")
    if damage == "missing":
        shutil.rmtree(os.path.dirname(os.path.dirname(mine)))
    elif damage == "another span's":  # span 1's: three classes, nine records, where span 4 holds four whites
        shutil.copy(Root(root).statistics(1, "train"), mine)
    else:
        open(mine, "wb").write(b"\xff not a proto")
    assert label_set(root) == LabelSet(WHITE, untrained=["grey"])


def test_a_span_whose_classes_cannot_be_read_stops_with_the_shard_named(held_then_let_in):
    root = held_then_let_in
    write_span(root, 4, {"train": of(1, 4, 4, 400)}, WHITE, {"train": 1})
    os.remove(Root(root).statistics(4, "train"))
    shard = os.path.join(Root(root).span(4), "train-00000-of-00001.tfrecord.gz")
    open(shard, "r+b").truncate(40)
    with pytest.raises(ResultError, match=f"span 4's classes cannot be read.*{shard}"):
        label_set(root)
