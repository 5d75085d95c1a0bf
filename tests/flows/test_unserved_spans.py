"""Train on what the served model has not seen, checked first: the skip of a scheduled run compares
the spans the data check let in with the served version's lineage, so a span published by hand, or by
a run stopped before training, is checked and trained on by the next run instead of stranded (the
flow doing so, started by an arrival event: tests/flows/test_deployments.py)."""
from __future__ import annotations

from beam_jobs.ingest import run as ingest
from components.common.files import read_json, write_json
from components.common.spans import Spans
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig
from components.report.report import write_report
from flows.demo import write_digits
from flows.pipeline import nothing_to_train
from tests.components.conftest import let_in
from tests.flows.conftest import TINY_BEAM, copy_of


def test_a_checked_span_the_served_model_has_not_seen_means_train(pushed_run, tmp_path):
    source, root = copy_of(pushed_run, tmp_path)
    config = RunConfig(source=source, root=root)
    assert "trained on every span the data check let in (1)" in nothing_to_train(config, [], skip_unchanged=True)
    write_digits(source, limit=60)  # 20 more land; a run published and checked them, then was stopped
    assert ingest([source, "--root", root, *TINY_BEAM]) == 0
    assert Spans(root).unchecked() == [2]  # not checked yet: not counted, and not read by training (the flow checks first)
    assert "every span the data check let in (1)" in nothing_to_train(config, [], skip_unchanged=True)
    let_in(root, 2)
    assert nothing_to_train(config, [], skip_unchanged=True) is None  # checked, not served: train
    assert nothing_to_train(config, [], skip_unchanged=False) is None


def test_a_span_number_holding_other_records_than_the_served_model_learnt_means_train(pushed_run, tmp_path):
    """The served version's lineage names span 1 with the SHA-256 of its manifest: a span 1 published again
    with other records (its folder deleted by hand) is new to it, for the skip and for the report."""
    source, root = copy_of(pushed_run, tmp_path)
    config = RunConfig(source=source, root=root)
    manifest = Root(root).manifest(1)
    write_json(manifest, read_json(manifest) | {"created": "2031-01-01T00:00:00Z"})  # other bytes, another digest
    assert Spans(root).unchecked() == [1]
    assert nothing_to_train(config, [], skip_unchanged=True) == "no span the data check let in to train on"
    let_in(root, 1)
    assert nothing_to_train(config, [], skip_unchanged=True) is None
    report = write_report(Root(root).run("report"))["summary"]
    assert report["unserved_spans"] == ["1 (ok)"], report["unserved_spans"]
