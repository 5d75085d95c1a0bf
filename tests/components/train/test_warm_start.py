"""Warm start: a run starts from the served model when it has the run's network, image size and labels,
trains on the new spans plus a replay sample of the history, and retrains fully when that changes.

The served model is the gate scenario's (tests/components/gate_runs.py: span 1 of red, green and
blue, two versions pushed), on a copy of its ROOT."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from components.common.files import read_result, write_json
from components.common.repository import Repository
from components.common.span_labels import label_set
from components.common.spans import Spans
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root, RunDir
from components.contracts.results import BackupStart
from components.contracts.run_config import RunConfig
from components.contracts.summaries import DataCheckRecord, rollback_command
from components.datacheck.span_status import release
from components.train import warm
from tests.components.conftest import TRAIN_LABELS, tiny_image, tiny_records, write_span
from tests.components.gate.test_gate_faults import quarantine
from tests.components.gate_runs import TINY, copy_root, gate_scenario, train_run


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


SERVED = LabelSet(TRAIN_LABELS)  # the gate scenario's served versions answer these


def config(root: str, **train) -> RunConfig:
    return RunConfig(source=root, root=root, preset="cpu",
                     train={"network": "small_cnn", "image_size": 32, "weights": "none", **train}).resolved()


def served(root: str) -> int:
    return Repository(root, "stoke").newest()


def spans(root: str) -> dict[int, str]:
    """The checked spans under `root`, each with its manifest's SHA-256: what training decides on."""
    return {n: Spans(root).manifest_sha256(n) for n in Spans(root).published() if Spans(root).check_record(n).trusted}


def test_a_run_with_the_served_labels_starts_from_its_weights_on_new_and_replayed_records(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": tiny_records(24, offset=7000)}, TRAIN_LABELS, {"train": 1})
    # A learning rate of 0: whatever the steps do, the trained weights are those the run started from.
    summary = train_run(root, "warm", "--epochs", "1", "--warm-learning-rate", "0")

    start = summary["start"]
    assert start["kind"] == "warm" and start["from_version"] == served(root)
    assert (start["new_spans"], start["replay_spans"], start["new_records"]) == ([2], [1], 24)
    # Each of the three classes of span 1's 64 records keeps the floor of 16 (more than its share of 24).
    assert start["replay_records"] == 3 * warm.MIN_REPLAY_PER_CLASS
    assert summary["steps_per_epoch"] == (24 + 48) // 8
    assert summary["phases"][0]["peak_learning_rate"] == 0
    assert sorted(summary["spans"]) == [1, 2]  # what the model has learnt from, for the lineage

    def kernels(path):
        reader = tf.train.load_checkpoint(f"{path}/variables/variables")
        return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
                if name.startswith("model/") and "kernel" in name}

    before = kernels(Repository(root, "stoke").version_uri(served(root)))
    after = kernels(summary["model_dir"])
    assert before.keys() == after.keys() and before
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)


def test_a_new_class_retrains_fully_and_says_so(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    labels = TRAIN_LABELS + ["grey"]
    records = [(tiny_image(0, 8000 + i), "jpeg", 3) for i in range(16)]
    write_span(root, 2, {"train": records}, labels, {"train": 1})
    summary = train_run(root, "new-class", "--epochs", "1")
    start = summary["start"]
    assert start["kind"] == "full" and start["from_version"] is None and start["replay_records"] == 0
    assert "new class grey" in start["reason"]
    assert start["new_spans"] == [1, 2] and start["new_records"] == 64 + 16


def test_replay_keeps_a_class_that_no_longer_arrives(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    reds = [(tiny_image(0, 9000 + i), "jpeg", 0) for i in range(48)]
    write_span(root, 2, {"train": reds}, TRAIN_LABELS, {"train": 2})
    summary = train_run(root, "reds", "--epochs", "2")
    assert summary["start"]["kind"] == "warm"
    assert summary["start"]["replay_records"] >= 2 * warm.MIN_REPLAY_PER_CLASS

    # The candidate still tells green and blue apart from red, on eval records it never trained on.
    module = tf.saved_model.load(summary["model_dir"])
    colours = [1, 2] * 12
    images = tf.constant([tiny_image(c, 9500 + i) for i, c in enumerate(colours)])
    answered = module.signatures["serving_default"](image_bytes=images)["class_ids"].numpy()
    assert np.mean(answered == np.array(colours)) >= 0.8, answered


def test_the_replay_sample_is_stratified_with_a_floor_for_every_class():
    history = [(0, 1, f"mem://a/{i}") for i in range(900)] + [(1, 1, f"mem://b/{i}") for i in range(50)] + \
              [(2, 2, f"mem://c/{i}") for i in range(5)]
    sample = warm.replay_sample(history, new_records=200, share=1.0, key="0:3")
    # 200 in the history's shares (900:50:5 gives 189, 11 and 2), each class at least the floor or all it has.
    assert sample.per_class == {0: 189, 1: warm.MIN_REPLAY_PER_CLASS, 2: 5}
    assert sample.records == 189 + 16 + 5 == len(history) - len(sample.left_out)
    assert not set(sample.left_out) & {(span, s) for _, span, s in history if s.startswith("mem://c/")}
    # A source in two spans of the history (a file rewritten in place) is two records, each kept or left out.
    twice = history + [(1, 2, source) for _, _, source in history[900:950]]
    again = warm.replay_sample(twice, 200, 1.0, "0:3")
    assert again.records + len(set(again.left_out)) == len(twice) and again.per_class[1] > 16
    # The same on a rerun; another night draws another sample.
    assert warm.replay_sample(history, 200, 1.0, "0:3") == sample
    assert set(warm.replay_sample(history, 200, 1.0, "0:4").left_out) != set(sample.left_out)


def _served_lineage(root: str, labels: list[str] | None = None, untrained: list[str] | None = None,
                    spans: list[int] | None = None, **training) -> None:
    """Rewrites the served version's lineage as if its run had been `training` (a warm run, say), with the
    label set `labels` less `untrained`, on `spans` (as published now)."""
    repository = Repository(root, "stoke")
    uri = repository.lineage_uri(repository.newest())
    with open(uri) as f:
        lineage = json.load(f)
    lineage["training"].update(training)
    lineage.update({key: value for key, value in (("labels", labels), ("untrained", untrained)) if value is not None})
    if spans is not None:
        lineage["spans"] = [dict(lineage["spans"][0], span=n, manifest_sha256=Spans(root).manifest_sha256(n))
                            for n in spans]
    with open(uri, "w") as f:
        json.dump(lineage, f)


@pytest.mark.parametrize("change, says", [
    ({"warm_start": False}, "train.warm_start is off"),
    ({"image_size": 48}, "train.image_size changed from 32 to 48"),
    ({"network": "mobilenet_v3_small"}, "train.network changed from small_cnn to mobilenet_v3_small"),
])
def test_a_changed_setting_retrains_fully(trained_runs, tmp_path, change, says):
    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": tiny_records(8, offset=7000)}, TRAIN_LABELS, {"train": 1})
    assert warm.decide(config(root), SERVED, spans(root)).kind == "warm"
    start = warm.decide(config(root, **change), SERVED, spans(root))
    assert start.kind == "full" and start.reason.startswith(says), start.reason


def test_every_full_every_warm_runs_in_a_row_a_full_retrain(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": tiny_records(8, offset=7000)}, TRAIN_LABELS, {"train": 1})
    start = {"kind": "warm", "reason": "", "from_version": 1, "new_spans": [1], "replay_spans": [],
             "new_records": 1, "replay_records": 0}
    _served_lineage(root, start=start | {"warm_runs_since_full": 2})
    assert warm.decide(config(root, full_every=3), SERVED, spans(root)).warm_runs_since_full == 3
    _served_lineage(root, start=start | {"warm_runs_since_full": 3})
    decided = warm.decide(config(root, full_every=3), SERVED, spans(root))
    assert decided.kind == "full" and "train.full_every 3" in decided.reason


def test_no_new_span_and_a_released_span_retrain_fully(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    # The scenario's second version was trained on the span the first had learnt: a full retrain, which
    # the push recorded in its lineage.
    lineage = Repository(root, "stoke").lineage(served(root))
    assert lineage.training.start.kind == "full" and "no checked span is new" in lineage.training.start.reason
    assert "no checked span is new" in warm.decide(config(root), SERVED, spans(root)).reason
    write_span(root, 2, {"train": tiny_records(8, offset=7000)}, TRAIN_LABELS, {"train": 1})
    base = Root(root)
    record = read_result(base.datacheck(2), DataCheckRecord).model_copy(update={
        "status": "released", "released_by": "ops", "released_at": "2025-01-02T00:00:00Z"})
    write_json(base.datacheck(2), record.to_json())
    decided = warm.decide(config(root), SERVED, spans(root))
    assert decided.kind == "full" and "released by hand" in decided.reason


def _served_start(trained_runs, tmp_path) -> tuple[warm.Start, str]:
    """A warm start from a copy of the served version's folder, and the copy's variables folder."""
    root = trained_runs["root"]
    version = served(root)
    copy = str(tmp_path / "models" / "stoke" / str(version))
    shutil.copytree(Repository(root, "stoke").version_uri(version), copy)
    return warm.Start(kind="warm", reason="", from_version=version, version_uri=copy,
                      rollback=rollback_command("/r o/ot", "stoke")), f"{copy}/variables"


def _cut(path: str, size) -> None:
    with open(path, "r+b") as f:
        f.truncate(size(f.seek(0, 2)))


def _garbage(path: str) -> None:
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 40)


DATA = "variables.data-00000-of-00001"


@pytest.mark.parametrize("damage", [
    lambda v: _cut(f"{v}/{DATA}", lambda n: n // 2),  # a copy stopped halfway: IndexError
    lambda v: _cut(f"{v}/{DATA}", lambda n: n // 4),
    lambda v: _cut(f"{v}/{DATA}", lambda n: n - 1),
    lambda v: _cut(f"{v}/{DATA}", lambda n: 0),
    lambda v: _cut(f"{v}/variables.index", lambda n: 0),
    lambda v: _cut(f"{v}/variables.index", lambda n: n // 2),
    lambda v: _garbage(f"{v}/variables.index"),
    lambda v: _garbage(f"{v}/{DATA}"),
    lambda v: os.remove(f"{v}/{DATA}"),
    lambda v: os.remove(f"{v}/variables.index"),
], ids=["data-half", "data-quarter", "data-one-byte-short", "data-empty", "index-empty", "index-half",
        "index-garbage", "data-garbage", "data-missing", "index-missing"])
def test_a_damaged_served_version_is_one_line_with_both_ways_out(trained_runs, tmp_path, damage):
    """Whatever the damage makes TensorFlow raise (IndexError, DataLossError, ValueError...), a warm start
    from a served version that cannot be restored says so in one line, with the two ways out."""
    from components.train import TrainError
    from components.train.models import build_model

    start, variables = _served_start(trained_runs, tmp_path)
    damage(variables)
    with pytest.raises(TrainError) as refused:
        warm.restore(build_model("small_cnn", len(TRAIN_LABELS), 32), start)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"served version {start.from_version} ({start.version_uri}) could not be restored for a warm start ("), message
    assert message.endswith("); set train.warm_start=false for a full retrain, or take it out of serving "
                            "(`stoke rollback --root '/r o/ot' --model-name stoke`)"), message


def test_a_served_version_without_saved_model_is_no_start(trained_runs, tmp_path):
    """TF Serving does not load a version without saved_model.pb, and a warm start does not start from it."""
    root = copy_root(trained_runs, tmp_path)
    newest = served(root)
    write_span(root, 2, {"train": tiny_records(8, offset=7000)}, TRAIN_LABELS, {"train": 1})
    os.remove(f"{Repository(root, 'stoke').version_uri(newest)}/saved_model.pb")
    start = warm.decide(config(root), SERVED, spans(root))
    assert start.from_version != newest and (start.from_version is None or start.warm), start


def test_every_new_record_is_trained_on_when_the_history_has_its_source(trained_runs, tmp_path):
    """A file rewritten in place comes back in a new span under its old image/source (here span 2's 24 records
    share their sources with span 1's): the history records the replay sample leaves out go, their namesakes
    in the new span stay, and the run reads exactly the new records and the sample."""
    from components.train import data, trainer

    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": tiny_records(24, offset=7000)}, TRAIN_LABELS, {"train": 1})
    run = config(root, batch_size=8)
    plan = trainer.make_plan(run, "probe")
    assert plan.start.warm and (plan.new_records, plan.replay_records) == (24, 48)
    left_out = {source for _, source in plan.excluded}
    new = {source for _, _, source in warm.labelled_sources([s for s in plan.train_shards if s.span == 2], False)}
    assert left_out & new  # the collision this is about
    options = data.PipelineOptions(batch_size=1, training=True, repeat=False, seed=1, exclude=plan.excluded)
    assert sum(1 for _ in data.make_dataset(plan.train_shards, run.train, options)) == 24 + 48


def _learnt(root: str, digests: dict[int, str]) -> None:
    """Rewrites the served version's lineage as if it had been trained on the spans `digests` names, each by
    the SHA-256 of its manifest."""
    repository = Repository(root, "stoke")
    uri = repository.lineage_uri(repository.newest())
    with open(uri) as f:
        lineage = json.load(f)
    lineage["spans"] = [lineage["spans"][0] | {"span": n, "manifest_sha256": digest} for n, digest in digests.items()]
    with open(uri, "w") as f:
        json.dump(lineage, f)


def test_a_span_number_published_again_is_new_to_the_served_model(trained_runs, tmp_path):
    """A span deleted by hand and its number published again holds records the served model never saw: its
    lineage names the number with another manifest. New, not history; with its own manifest, learnt."""
    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": tiny_records(8, offset=7000)}, TRAIN_LABELS, {"train": 1})
    now = spans(root)
    _learnt(root, {1: now[1], 2: "0" * 64})
    start = warm.decide(config(root), SERVED, now)
    assert (start.kind, start.new_spans, start.replay_spans) == ("warm", (2,), (1,)), start
    _learnt(root, {1: "1" * 64, 2: "0" * 64})  # every span other records: all new, nothing to replay
    start = warm.decide(config(root), SERVED, now)
    assert (start.kind, start.new_spans, start.replay_spans) == ("warm", (1, 2), ()), start
    _learnt(root, now)
    assert "no checked span is new" in warm.decide(config(root), SERVED, now).reason


def _start(kind: str, version: int | None = None, lineage: str | None = None) -> warm.Start:
    return warm.Start(kind=kind, reason="", from_version=version, lineage=lineage)


def test_a_backup_is_resumed_only_from_the_start_it_grew_from():
    v2 = _start("warm", 2, "run b, pushed 2026-01-02T00:00:00Z")
    assert warm.resumable(warm.backup_start(v2), v2) is None
    assert warm.resumable(warm.backup_start(_start("full")), _start("full")) is None
    for made, now in [(v2, _start("warm", 1, "run a, pushed 2026-01-01T00:00:00Z")),  # rolled back since
                      (v2, _start("warm", 2, "run c, pushed 2026-01-03T00:00:00Z")),  # another push under the number
                      (v2, _start("full")), (_start("full"), v2)]:
        why = warm.resumable(warm.backup_start(made), now)
        assert why and "\n" not in why, (made, now)
    assert "records no start" in warm.resumable(None, v2)
    assert "grew from served version 2 (run b" in warm.resumable(warm.backup_start(v2), _start("full"))


def _backed_up(run: RunDir, made: warm.Start | None) -> None:
    """A backup as a run killed mid-training leaves it, made under `made` (None: one that records no start)."""
    os.makedirs(os.path.join(run.backup, "chief"))
    open(os.path.join(run.backup, "chief", "checkpoint"), "w").write("model_checkpoint_path: 'ckpt-4'\n")
    if made is not None:
        write_json(run.backup_start, warm.backup_start(made).to_json())


@pytest.mark.parametrize("made, now, kept", [
    (_start("warm", 2, "run b, pushed t2"), _start("warm", 2, "run b, pushed t2"), True),
    (_start("full"), _start("full"), True),
    (_start("warm", 2, "run b, pushed t2"), _start("warm", 1, "run a, pushed t1"), False),  # rolled back
    (_start("warm", 2, "run b, pushed t2"), _start("full"), False),  # train.warm_start=false
    (_start("full"), _start("warm", 2, "run b, pushed t2"), False),
    (None, _start("full"), False),  # a backup made before backups recorded their start
], ids=["same-warm", "same-full", "rolled-back", "warm-start-off", "full-then-warm", "no-record"])
def test_a_rerun_drops_a_backup_made_under_another_start_and_says_so(tmp_path, capsys, made, now, kept):
    from components.train import trainer

    run = RunDir(str(tmp_path / "runs" / "k"))
    _backed_up(run, made)
    trainer.keep_backup(types.SimpleNamespace(run=run, work=run, start=now))
    err = capsys.readouterr().err
    assert os.path.exists(os.path.join(run.backup, "chief", "checkpoint")) == kept
    assert read_result(run.backup_start, BackupStart) == warm.backup_start(now)  # what the backup grows from now
    if kept:
        assert err == ""
    else:
        assert err.count("\n") == 1 and err.startswith("stoke train: dropped the backup of run k: "), err


def test_a_warm_run_resumed_after_a_rollback_starts_from_the_version_served_now(trained_runs, tmp_path, capsys):
    """Killed mid-training, warm from the newest version; that version rolled back; the same run id again: its
    backup, grown from the rolled-back weights, is dropped, and the run starts from the version served now,
    which is what its metrics.json (and so the lineage) says."""
    from components.push.rollback import rollback

    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": tiny_records(24, offset=7000)}, TRAIN_LABELS, {"train": 1})
    older, newest = Repository(root, "stoke").versions()
    args = ["--epochs", "1", "--backup-every", "2"]
    killed = subprocess.run([sys.executable, "-m", "components.train", "--root", root, "--run-id", "k", *TINY,
                             "--json", *args], capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, STOKE_KILL_AT_STEP="3", TF_CPP_MIN_LOG_LEVEL="2"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run = Root(root).run("k")
    assert os.listdir(os.path.join(run.backup, "chief"))
    rollback(root, reason="it misread blue")
    summary = train_run(root, "k", *args)
    assert summary["start"]["kind"] == "warm" and summary["start"]["from_version"] == older
    assert summary["resumed_from_step"] == 0 and summary["total_steps"] == (24 + 48) // 8
    assert f"stoke train: dropped the backup of run k: it grew from served version {newest} (run mixed" \
           in capsys.readouterr().err


GREY = [*TRAIN_LABELS, "grey"]
GREY_WHITE = [*GREY, "white"]


def _labelled(colour: int, label: int, count: int, offset: int) -> list[tuple[bytes, str, int]]:
    return [(tiny_image(colour, offset + i), "jpeg", label) for i in range(count)]


def test_a_held_class_changes_nothing_and_a_class_let_in_above_it_is_trained_without_it(trained_runs, tmp_path):
    """Span 2 brings grey (id 3) and the data check holds it back; ingest has appended grey to labels.json, and
    span 3, let in, lists it (its manifest has the labels of the time) with records of the served classes only.
    The run is warm on the served label set, as if span 2 were not there. Span 4, let in, brings white (id 4):
    a full retrain for white alone, whose model keeps grey's id and never answers grey."""
    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": _labelled(0, 3, 16, 8000)}, GREY, {"train": 1})
    quarantine(root, 2)
    write_span(root, 3, {"train": tiny_records(24, offset=7000)}, GREY, {"train": 1})
    held = train_run(root, "held", "--epochs", "1")
    assert held["start"]["kind"] == "warm" and (held["labels"], held["untrained"]) == (TRAIN_LABELS, [])
    assert held["start"]["new_spans"] == [3]

    write_span(root, 4, {"train": _labelled(1, 4, 16, 8100) + tiny_records(8, offset=7100)}, GREY_WHITE, {"train": 1})
    white = train_run(root, "white", "--epochs", "1")
    start = white["start"]
    assert start["kind"] == "full" and start["reason"] == f"new class white since served version {served(root)}"
    assert (white["labels"], white["untrained"]) == (GREY_WHITE, ["grey"])
    assert any("carries grey" in w and "never answers it" in w for w in white["warnings"])
    answers = tf.saved_model.load(white["model_dir"]).signatures["serving_default"](image_bytes=tf.constant(
        [tiny_image(colour, 9700 + i) for i, colour in enumerate([0, 1, 2] * 8)]))
    assert answers["probabilities"].shape == (24, 5) and np.all(answers["probabilities"].numpy()[:, 3] == 0)
    assert 3 not in answers["class_ids"].numpy() and b"grey" not in answers["labels"].numpy()


def test_the_served_label_set_against_a_held_class_and_its_release_for_warm_start_and_the_gate(trained_runs, tmp_path):
    """The comparisons of warm start and of the gate once a model keeping grey's id without answering it is
    served (spans as above): a run on the same label set is warm and compared on every class it answers; once
    span 2 is released grey is a new class, for a full retrain and for the gate (compared on the classes both
    answer, grey's id left out); a candidate that no longer answers a served class is refused."""
    from components.gate import gate

    root = copy_root(trained_runs, tmp_path)
    write_span(root, 2, {"train": _labelled(0, 3, 4, 8000)}, GREY, {"train": 1})
    quarantine(root, 2)
    write_span(root, 3, {"train": _labelled(1, 4, 4, 8100)}, GREY_WHITE, {"train": 1})
    version = served(root)
    _served_lineage(root, labels=GREY_WHITE, untrained=["grey"], spans=[1, 3])
    held = label_set(root)
    assert held == LabelSet(GREY_WHITE, ["grey"])
    write_span(root, 4, {"train": tiny_records(8, offset=7200)}, GREY_WHITE, {"train": 1})
    start = warm.decide(config(root), label_set(root), spans(root))
    assert start.kind == "warm" and start.new_spans == (4,)
    compared = gate._served(Repository(root, "stoke"), held)
    assert compared.shared is None and compared.retained[version][1] == {0, 1, 2, 4}

    release(Root(root), 2, by="ops")
    released = label_set(root)
    assert released == LabelSet(GREY_WHITE)
    start = warm.decide(config(root), released, spans(root))
    assert start.kind == "full" and start.reason == f"new class grey since served version {version}"
    compared = gate._served(Repository(root, "stoke"), released)
    assert compared.shared == ["red", "green", "blue", "white"] and compared.retained[version][1] == {0, 1, 2, 4}
    assert f"served version {version} knows 4 classes, the candidate added grey" in compared.notes[-1]

    _served_lineage(root, labels=GREY_WHITE, untrained=[])  # grey served; a candidate without a record of it
    refused = gate._served(Repository(root, "stoke"), held)
    assert refused.uri is None and refused.refusals == [
        f"the candidate does not know grey, which the served version {version} answers: a new version must keep every "
        "served class (were spans left out of training?)"]
