"""The class mix judged as arrivals come, on spans published with their statistics and checked one by
one by the real data check: a night of two of three classes warns and trains, the third such night in a
row quarantines (a feed that died) until a release accepts the class gone, and a label no span let in
had quarantines its span with examples read from the span's content index."""
from __future__ import annotations

import pytest

from beam_jobs.statistics import write_statistics
from components.common.files import read_result
from components.common.spans import Spans
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig
from components.contracts.summaries import DataCheckRecord
from components.datacheck import datacheck, span_status
from tests.components.conftest import tiny_image, write_span

LABELS = ["brick", "grass", "gravel", "sand"]
EVERY = {"brick": 40, "grass": 40, "gravel": 40}
SKEWED = {"brick": 60, "grass": 60}  # a night of one line: no gravel


def arrive(root: str, number: int, mix: dict[str, int]) -> list[str]:
    """Publishes span `number` with `mix` records per class (a quarter of each in eval) and its statistics,
    as ingest does, then runs the data check; returns the statuses it recorded."""
    labels = [LABELS.index(name) for name, count in mix.items() for _ in range(count)]
    records = [(tiny_image(label % 3, 1000 * number + i), "jpeg", label) for i, label in enumerate(labels)]
    splits = {"train": [r for i, r in enumerate(records) if i % 4], "eval": records[::4]}
    write_span(root, number, splits, LABELS, {"train": 1, "eval": 1}, checked=False)
    write_statistics(Root(root), number, [
        {"uri": f"{split}/{i}", "split": split, "label": LABELS[label], "format": "jpeg", "bytes": 100,
         "mean": 100.0, "std": 20.0, "width": 40, "height": 32}
        for split, part in splits.items() for i, (_, _, label) in enumerate(part)], [], LABELS)
    # min_class_examples=0: no rare-class warning for sand, a label of labels.json, before it has records
    settings = RunConfig(root=root, datacheck={"min_class_examples": 0})
    return [(c.span, c.status) for c in datacheck.check_spans(settings).spans]


def trained_on(root: str) -> set[int]:
    return {s.span for s in Spans(root).shards("train")}


def test_skewed_nights_train_and_the_third_in_a_row_quarantines_until_released(tmp_path):
    root = str(tmp_path)
    assert arrive(root, 1, EVERY) == [(1, "ok")]
    assert arrive(root, 2, SKEWED) == [(2, "warning")]  # was quarantined: "label mix shifted by 0.33"
    record = read_result(Root(root).datacheck(2), DataCheckRecord)
    assert {(a.kind, a.severity) for a in record.anomalies} == {("label_drift", "warning"), ("absent_class", "warning")}
    assert record.reasons == [] and trained_on(root) == {1, 2}
    assert arrive(root, 3, SKEWED) == [(3, "warning")]
    assert arrive(root, 4, SKEWED) == [(4, "quarantined")]
    record = read_result(Root(root).datacheck(4), DataCheckRecord)
    assert record.reasons[0].startswith("class 'gravel' has stopped arriving: none in the last 3 arrivals (spans 2, 3, 4")
    assert trained_on(root) == {1, 2, 3}
    assert arrive(root, 5, SKEWED) == [(5, "quarantined")]  # still gone: spans 2, 3 and 5 lack it
    # The class is retired: a release of span 4 accepts it gone, and later nights without it train.
    span_status.release(Root(root), 4, by="ana")
    assert arrive(root, 6, SKEWED) == [(6, "ok")]
    assert not [a for a in read_result(Root(root).datacheck(6), DataCheckRecord).anomalies if a.class_name == "gravel"
                and a.kind != "label_drift"]
    assert trained_on(root) == {1, 2, 3, 4, 6}
    # Back again, and gone again: judged afresh.
    assert arrive(root, 7, EVERY) == [(7, "warning")]  # the mix moved back: a warning
    assert [arrive(root, n, SKEWED) for n in (8, 9, 10)] == [[(8, "warning")], [(9, "warning")], [(10, "quarantined")]]


@pytest.mark.parametrize("sand", [1, 40])
def test_a_label_no_span_let_in_had_quarantines_its_span_with_examples(tmp_path, sand):
    root = str(tmp_path)
    arrive(root, 1, EVERY)
    assert arrive(root, 2, {**EVERY, "sand": sand}) == [(2, "quarantined")]
    record = read_result(Root(root).datacheck(2), DataCheckRecord)
    (error,) = [a for a in record.anomalies if a.severity == "error"]
    assert (error.kind, error.class_name, error.count) == ("new_label", "sand", sand)
    assert len(error.examples) == min(sand, 5) and all(uri.startswith("mem://") for uri in error.examples)
    assert f"label 'sand' is new: {sand} of span 2's {120 + sand} records" in record.reasons[0]
    assert trained_on(root) == {1}
    # Another night with it is held back too, until a person lets the label in; then it is known.
    assert arrive(root, 3, {**EVERY, "sand": 5}) == [(3, "quarantined")]
    span_status.release(Root(root), 2, by="ana")
    assert arrive(root, 4, {**EVERY, "sand": 5}) == [(4, "ok")]
