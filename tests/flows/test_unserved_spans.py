"""Train on what the served model has not seen, checked first: the skip of a scheduled run compares
the spans the data check let in with the served version's lineage, so a span published by hand, or by
a run stopped before training, is checked and trained on by the next run instead of stranded (the
flow doing so, started by an arrival event: tests/flows/test_deployments.py)."""
from __future__ import annotations

from beam_jobs.ingest import run as ingest
from components.common.spans import Spans
from components.contracts.run_config import RunConfig
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
