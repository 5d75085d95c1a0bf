"""Train on what the served model has not seen, checked first: the skip of a scheduled run compares
the spans the data check let in with the served version's lineage, so a span published by hand, or by
a run stopped before training, is checked and trained on by the next run instead of stranded."""
from __future__ import annotations

import shutil

from beam_jobs.ingest import run as ingest
from components.common.files import read_json
from components.common.spans import Spans
from components.contracts.config import GateConfig, PushConfig, TrainConfig
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig
from flows.demo import write_digits
from flows.pipeline import nothing_to_train, pipeline
from tests.components.conftest import let_in
from tests.flows.conftest import TINY_BEAM, TINY_MODEL


def copy_of(pushed_run, tmp_path) -> tuple[str, str]:
    """The served ROOT of the session's first run, and its source, copied: this test adds spans."""
    source, root = str(tmp_path / "digits"), str(tmp_path / "root")
    shutil.copytree(pushed_run["source"], source)
    shutil.copytree(pushed_run["root"], root)
    return source, root


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


def test_a_span_published_by_hand_is_checked_and_trained_on_by_the_next_scheduled_run(pushed_run, tmp_path):
    source, root = copy_of(pushed_run, tmp_path)
    write_digits(source, limit=60)
    assert ingest([source, "--root", root, *TINY_BEAM]) == 0  # by hand: published, never checked
    assert {s.span for s in Spans(root).shards("train")} == {1}  # training would not read it yet
    state = pipeline(source=source, root=root, preflight=None, preset="demo", train=TrainConfig(**TINY_MODEL),
                     gate=GateConfig(min_accuracy=0.0), push=PushConfig(build_image=False), beam_args=TINY_BEAM,
                     skip_unchanged=True, run_id="caught-up", return_state=True)
    assert state.is_completed(), state.message
    run = Root(root).run("caught-up")
    report = read_json(run.report_json)
    assert report["status"] != "skipped", report["message"]
    assert [check["span"] for check in report["datacheck"]["spans"]] == [2]
    assert read_json(run.metrics)["spans"] == [1, 2]
