"""`stoke train` on the CPU: each precision, XLA, each strategy, resume after a kill, corrupt shards.

Runs that need a fresh TensorFlow (logical CPU devices, a cluster, a killed process) are
subprocesses; the rest call `train.run` in this process.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from components.common.files import write_json
from components.common.spans import Spans
from components.contracts import summaries
from components.contracts.layout import Root
from components.train import data, recipe
from components.train import trainer as train
from tests.components.conftest import TRAIN_LABELS, let_in, tiny_image, tiny_records, write_span
from tests.components.train.test_input_pipeline import corrupt_record
from tests.hints import assert_runnable
from tests.waiting import free_ports

TINY = ["--network", "small_cnn", "--weights", "none", "--image-size", "32", "--batch-size", "8", "--input-probe-steps", "2",
        "--trace-steps", "none"]


def _train(capsys, root, *args) -> dict:
    code = train.run(["--root", root, *TINY, "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out[-1]
    return json.loads(out[-1])


def _env(**extra) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _spawn(root, *args, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "components.train", "--root", root, *TINY, "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**env))


def finish(process: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Its stdout and stderr once it exits; past `timeout` it is killed before the test fails, so that a
    run that hangs does not go on taking a core from every test after it."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise


def _summary(process: subprocess.Popen) -> dict:
    out, err = finish(process, 240)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def float32_json(small_spans_root):
    """The float32 run, with --json: its metrics.json and the lines it printed (capsys is function-scoped).
    One run for the tests of its artifacts and of its progress events."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # Seeded: two epochs of six steps, read through EMA's average, sit near chance for an unlucky start.
        assert train.run(["--root", small_spans_root, *TINY, "--run-id", "f32", "--seed", "1", "--epochs", "2",
                          "--precision", "float32", "--no-xla", "--trace-steps", "2,3", "--ema", "--json"]) == 0
    metrics = json.loads(open(os.path.join(small_spans_root, "runs", "f32", "metrics.json")).read())
    return metrics, out.getvalue().strip().splitlines()


@pytest.fixture(scope="module")
def float32_run(float32_json):
    return float32_json[0]


def test_float32_run_writes_every_artifact(float32_run, small_spans_root):
    run_dir = os.path.join(small_spans_root, "runs", "f32")
    assert float32_run["run_dir"] == run_dir
    assert (float32_run["precision"], float32_run["xla"], float32_run["strategy"]) == ("float32", False, "one_device")
    assert float32_run["total_steps"] == 2 * float32_run["steps_per_epoch"] == 2 * (48 // 8)
    assert float32_run["eval"]["accuracy"] > 0.5, float32_run["eval"]  # 3 colour classes: chance is 1/3
    assert float32_run["train"]["loss"] < float32_run["history"]["loss"][0]
    assert float32_run["images_per_sec"] > 0
    probe = float32_run["input"]
    assert probe["input_images_per_sec"] > 0 and probe["model_images_per_sec_synthetic"] > 0
    assert isinstance(probe["input_bound"], bool) and probe["input_wait_seconds"] >= 0
    for name in ("candidate/saved_model.pb", "metrics.json", "curves.png"):
        assert os.path.exists(os.path.join(run_dir, name)), name
    assert open(os.path.join(run_dir, "curves.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    profiles = os.path.join(run_dir, "tensorboard", "plugins", "profile")
    assert os.listdir(profiles), "the profiled step range left no trace"
    assert not os.path.exists(os.path.join(run_dir, "backup"))  # a finished run drops its backup, folder and all
    assert float32_run["batch_size"] == 8 and float32_run["exported_weights"] == "ema"
    assert float32_run["schedule"]["kind"] == "cosine" and float32_run["schedule"]["warmup_steps"] == 2  # capped
    assert float32_run["best_epoch"]["epoch"] in (1, 2)
    assert "only 12 training steps" in float32_run["warnings"][0]


def _assert_evaluated_once(summary: dict, root: str) -> None:
    """The summary's eval figures are the candidate's accuracy and mean loss over every eval record
    taken once, as the gate counts them."""
    loaded = tf.saved_model.load(summary["model_dir"])
    records = [r.numpy() for shard in Spans(root).shards("eval") for r in tf.data.TFRecordDataset(shard.uri, "GZIP")]
    assert len(records) % 8 and len(records) % 16  # the last batch is partial
    labels = np.array([int(data.parse(r)[1]) for r in records])
    probabilities = loaded.signatures["examples"](examples=tf.constant(records))["probabilities"].numpy()
    loss = -np.log(probabilities[np.arange(len(labels)), labels]).mean()
    assert summary["eval"]["accuracy"] == pytest.approx((probabilities.argmax(1) == labels).mean(), abs=1e-6)
    assert summary["eval"]["loss"] == pytest.approx(loss, rel=1e-4)


def test_the_candidate_is_the_average_the_run_evaluated(float32_run, small_spans_root):
    """The last epoch's validation measured the moving average: the export is the weights evaluated,
    on each eval record once."""
    _assert_evaluated_once(float32_run, small_spans_root)


def test_no_best_checkpoint_is_written(float32_run, small_spans_root):
    """The candidate is the end of the run: a best-by-eval-loss checkpoint would never be read."""
    assert not os.path.exists(os.path.join(small_spans_root, "runs", "f32", "checkpoints"))


def test_candidate_serves_image_bytes_and_examples(float32_run, small_spans_root):
    loaded = tf.saved_model.load(float32_run["model_dir"])
    images = [tiny_image(label, 5000 + label, image_format=fmt) for label, fmt in ((0, "jpeg"), (1, "png"), (2, "jpeg"))]
    serve = loaded.signatures["serving_default"]
    assert list(serve.structured_input_signature[1]) == ["image_bytes"]
    out = serve(image_bytes=tf.constant(images))
    assert out["probabilities"].dtype == tf.float32 and out["probabilities"].shape == (3, 3)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    assert out["class_ids"].dtype == tf.int64
    assert [x.decode() for x in out["labels"].numpy()] == [TRAIN_LABELS[i] for i in out["class_ids"].numpy()]

    shard = Spans(small_spans_root).shards("eval")[0]
    records = [r.numpy() for r in tf.data.TFRecordDataset(shard.uri, "GZIP").take(4)]
    by_example = loaded.signatures["examples"](examples=tf.constant(records))
    encoded = [data.parse(r)[0].numpy() for r in records]
    by_bytes = serve(image_bytes=tf.constant(encoded))
    np.testing.assert_allclose(by_example["probabilities"], by_bytes["probabilities"], rtol=1e-5)
    assert "XlaLaunch" not in str(loaded.signatures["serving_default"].graph.as_graph_def())


def test_the_probe_describes_what_the_spans_hold(float32_run):
    probe = float32_run["input"]
    assert probe["compression"] == "gzip" and probe["cache"] is None
    assert probe["stored_short_side"] == 32 and 0.5 < probe["jpeg_share"] < 1  # tiny_records: 3 of 4 JPEG
    assert probe["decoded_gb"] == pytest.approx(48 * 32 * 40 * 3 / 1e9) and probe["memory_gb"] > 0


def test_candidate_refuses_an_image_declaring_too_many_pixels(float32_run):
    from tests.beam_jobs.images import png_declaring

    serve = tf.saved_model.load(float32_run["model_dir"]).signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than 50 megapixels"):
        serve(image_bytes=tf.constant([tiny_image(0, 1), png_declaring(13000, 13000)]))


def test_a_larger_image_size_than_the_spans_hold_is_warned_about(tmp_path, capsys):
    root = str(tmp_path / "root")
    write_span(root, 1, {"train": tiny_records(8)}, TRAIN_LABELS, {"train": 1})
    manifest = Spans(root).manifests()[0]
    write_json(Root(root).manifest(1), manifest.model_copy(update={"max_side": 24}).to_json())
    let_in(root, 1)  # the check judges the manifest as ingest wrote it
    assert train.run(["--root", root, *TINY, "--run-id", "upsampled", "--epochs", "1", "--input-probe-steps", "0"]) == 0
    err = capsys.readouterr().err
    assert "train.image_size 32 is larger than the spans hold (ingested with ingest.max_side 24)" in err
    assert "`--set ingest.max_side=512` (by hand: `stoke ingest --max-side 512`)" in err
    assert_runnable(err)


def test_a_batch_larger_than_the_split_names_one_that_fits(tmp_path, capsys):
    root = str(tmp_path / "root")
    write_span(root, 1, {"train": tiny_records(8)}, TRAIN_LABELS, {"train": 1})
    let_in(root, 1)
    argv = ["--root", root, *TINY, "--batch-size", "16", "--run-id", "big-batch", "--epochs", "1", "--json"]
    assert train.run(argv) == 1
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert "lower the batch size, e.g. `--set train.batch_size=8` (by hand: `stoke train --batch-size 8`)" in error
    assert_runnable(error)


def test_summary_is_the_last_line_and_a_finished_run_is_not_redone(float32_run, small_spans_root, capsys):
    assert train.run(["--root", small_spans_root, *TINY, "--run-id", "f32", "--json"]) == 1
    out, err = capsys.readouterr()
    assert "already finished" in json.loads(out.strip().splitlines()[-1])["error"]
    assert "Traceback" not in err


def test_mixed_bfloat16_with_xla_learns_and_exports_float32(small_spans_root, capsys):
    summary = _train(capsys, small_spans_root, "--run-id", "bf16", "--precision", "mixed_bfloat16", "--xla",
                     "--epochs", "3", "--label-smoothing", "0.1", "--seed", "1")
    assert (summary["precision"], summary["xla"], summary["total_steps"]) == ("mixed_bfloat16", True, 18)
    assert summary["eval"]["accuracy"] > 0.5  # as float32 in the same steps; chance is 1/3
    reader = tf.train.load_checkpoint(os.path.join(summary["model_dir"], "variables", "variables"))
    dtypes = {dtype for name, dtype in reader.get_variable_to_dtype_map().items() if "layer" in name}
    assert dtypes == {tf.float32}


def test_xla_on_one_device(small_spans_root, capsys):
    summary = _train(capsys, small_spans_root, "--run-id", "xla", "--xla", "--epochs", "1",
                     "--steps-per-epoch", "3", "--steps-per-execution", "3")
    assert summary["xla"] is True and summary["total_steps"] == 3
    assert np.isfinite(summary["eval"]["loss"])


def test_with_json_each_epoch_is_a_progress_event_before_the_summary(float32_json):
    lines = float32_json[1]
    events = [e for e in map(summaries.event, lines) if e is not None]
    assert [(e.stage, e.done, e.total, e.unit) for e in events] == [("train", 1, 2, "epochs"), ("train", 2, 2, "epochs")]
    assert summaries.event(lines[-1]) is None and json.loads(lines[-1])["epochs"] == 2


def test_mirrored_over_two_logical_cpus(small_spans_root):
    summary = _summary(_spawn(small_spans_root, "--run-id", "mirrored", "--strategy", "mirrored",
                              "--cpu-devices", "2", "--no-xla", "--epochs", "1"))
    assert (summary["strategy"], summary["replicas"], summary["global_batch_size"]) == ("mirrored", 2, 16)
    assert summary["total_steps"] == 48 // 16
    _assert_evaluated_once(summary, small_spans_root)  # 19 records over two replicas: 32 predictions


def test_multi_worker_on_two_local_processes(small_spans_root, tmp_path):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    scratch = tmp_path / "worker-tmp"
    scratch.mkdir()
    processes = [
        _spawn(small_spans_root, "--run-id", "mwms", "--epochs", "1", "--no-xla",
               TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
               TMPDIR=str(scratch if index else tmp_path))
        for index in (0, 1)]
    chief, worker = [_summary(p) for p in processes]
    for summary in (chief, worker):
        assert (summary["strategy"], summary["workers"], summary["replicas"]) == ("multi_worker", 2, 2)
        assert summary["total_steps"] == 48 // 16
    run_dir = os.path.join(small_spans_root, "runs", "mwms")
    assert json.load(open(os.path.join(run_dir, "metrics.json")))["workers"] == 2
    _assert_evaluated_once(chief, small_spans_root)  # 10 and 9 records on the two workers
    assert not list(scratch.glob("stoke-worker-*")), "the worker kept its copy of the model"
    assert not [name for _, folders, files in os.walk(run_dir) for name in folders + files if "workertemp" in name]


def test_killed_run_resumes_from_backup_with_the_same_step_count(small_spans_root, capsys):
    args = ["--run-id", "resume", "--epochs", "2", "--backup-every", "2", "--no-xla"]
    killed = _spawn(small_spans_root, *args, STOKE_KILL_AT_STEP="7")
    finish(killed, 240)
    assert killed.returncode == -signal.SIGKILL
    backup = os.path.join(small_spans_root, "runs", "resume", "backup")
    assert os.listdir(backup)
    assert not os.path.exists(os.path.join(small_spans_root, "runs", "resume", "metrics.json"))

    summary = _train(capsys, small_spans_root, *args)
    assert summary["resumed_from_step"] == 6  # the last backup before the kill at step 7
    assert summary["total_steps"] == 2 * 6
    assert len(summary["history"]["loss"]) == 1  # only the second epoch was left to run
    # The schedule went on from step 6 of 12: its last step's rate, not a restart's.
    schedule = recipe.WarmupCosine(summary["schedule"]["peak_learning_rate"], summary["schedule"]["warmup_steps"], 12)
    assert summary["history"]["learning_rate"] == [pytest.approx(float(schedule(11)), rel=1e-5)]
    assert summary["best_epoch"]["epoch"] == 2
    assert not os.path.exists(backup)  # resumed and finished: the backup goes, folder and all


@pytest.fixture(scope="module")
def train_corrupt_root(small_spans_root, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("train-corrupt") / "root")
    shutil.copytree(small_spans_root, root, ignore=shutil.ignore_patterns("runs"))
    corrupt_record(Spans(root).shards("train")[2].uri, 3)
    return root


def test_corrupt_shard_stops_training_naming_the_shard(train_corrupt_root, capsys):
    code = train.run(["--root", train_corrupt_root, *TINY, "--run-id", "stop", "--epochs", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "corrupt shard" in err and "train-00002-of-00003.tfrecord.gz" in err
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert "`--set train.skip_corrupt=true` (by hand: `stoke train --skip-corrupt`)" in error
    assert_runnable(error)


def test_skip_corrupt_trains_on_the_rest_and_counts_it(train_corrupt_root, capsys):
    summary = _train(capsys, train_corrupt_root, "--run-id", "skip", "--epochs", "1", "--skip-corrupt")
    assert summary["corrupt"]["skipped_records"] == 16 - 3
    assert summary["corrupt"]["shards"][0]["uri"].endswith("train-00002-of-00003.tfrecord.gz")
    assert summary["steps_per_epoch"] == (48 - 13) // 8


@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_a_shard_tensorflow_reads_short_stops_training_naming_it(small_spans_root, tmp_path, capsys, skip_corrupt):
    """Its bytes are those the manifest names, and TensorFlow reads 3 of its 16 records without an error: no
    damage to read around, so --skip-corrupt stops too (before the first step), rather than train on a part."""
    from tests.components.conftest import read_short_by_tensorflow

    root = str(tmp_path / "root")
    shutil.copytree(small_spans_root, root, ignore=shutil.ignore_patterns("runs"))
    shard = read_short_by_tensorflow(root, 1, "train")
    code = train.run(["--root", root, *TINY, "--run-id", "short", "--epochs", "1", "--json",
                      *(["--skip-corrupt"] if skip_corrupt else [])])
    out, err = capsys.readouterr()
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert code == 1 and err.strip().splitlines()[-1] == f"stoke train: error: {error}" and "Traceback" not in err, err
    assert error.startswith(f"TensorFlow reads shards short, without an error: {shard} (3 of 16 records): "), error
    assert error.endswith("ingest their sources again into a new span: move the span's folder out of ROOT, then ingest")
    assert not os.path.exists(Root(root).run("short").candidate)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_span_whose_shards_changed_after_publishing_is_not_trained_on(small_spans_root, tmp_path, capsys, split):
    """Every shard of one split rewritten with label 0 (records that read, not those published): the run
    stops before training, in one line naming the span, a shard and what to do."""
    from tests.components.conftest import relabel

    root = str(tmp_path / "root")
    shutil.copytree(small_spans_root, root, ignore=shutil.ignore_patterns("runs"))
    changed = Spans(root).shards(split)
    for shard in changed:
        relabel(shard.uri, 0)
    code = train.run(["--root", root, *TINY, "--run-id", "changed", "--epochs", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert error.startswith("span 1 changed after it was published: ") and changed[0].uri in error, error
    assert "restore the span's folder from a backup" in error
    assert not os.path.exists(os.path.join(root, "runs", "changed", "metrics.json"))


def test_refuses_a_root_without_spans_and_a_run_id_that_leaves_runs(tmp_path, small_spans_root, capsys):
    assert train.run(["--root", str(tmp_path), "--json"]) == 1
    assert "no published span" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert train.run(["--root", small_spans_root, "--run-id", "../escape", "--json"]) == 2  # bad settings
    assert "bad run id" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "efficientnet_b0", "resnet50"])
def test_application_models_take_uint8_and_give_float32_logits(name):
    import tf_keras as keras

    from components.train.models import build_model

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model(name, 5, 32)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    logits = model(tf.zeros([2, 32, 32, 3], tf.uint8), training=False)
    assert logits.shape == (2, 5) and logits.dtype == tf.float32
    assert model.get_layer("logits").compute_dtype == "float32"


def test_real_digits_generalize_to_the_eval_split(tmp_path, capsys):
    """The demo digits (real scans, 10 classes): eval accuracy in a short run gets far above chance,
    which catches inference-only faults (such as batch-norm statistics) that train accuracy hides."""
    from flows.demo import NAMES, write_digits
    from tests.components.conftest import write_span

    write_digits(str(tmp_path / "digits"), limit=640)
    records = [(path.read_bytes(), "png", NAMES.index(path.parent.name))
               for path in sorted((tmp_path / "digits").glob("*/*.png"))]
    root = str(tmp_path / "root")
    splits = {"train": [r for i, r in enumerate(records) if i % 8], "eval": records[::8]}
    write_span(root, 1, splits, NAMES, {"train": 2, "eval": 1})
    summary = _train(capsys, root, "--run-id", "digits", "--epochs", "10", "--batch-size", "32", "--no-flip")
    assert max(summary["history"]["val_accuracy"]) > 0.5  # chance is 0.1


def test_the_same_seed_gives_the_same_model(small_spans_root, capsys):
    first, second = (_train(capsys, small_spans_root, "--run-id", f"seed-{n}", "--seed", "7", "--epochs", "1",
                            "--steps-per-epoch", "3", "--no-xla", "--input-probe-steps", "0") for n in (1, 2))
    assert first["seed"] == 7
    assert first["eval"]["accuracy"] == pytest.approx(second["eval"]["accuracy"], abs=1e-3)
    assert first["eval"]["loss"] == pytest.approx(second["eval"]["loss"], abs=1e-3)
    assert first["history"]["loss"] == pytest.approx(second["history"]["loss"], abs=1e-3)


def test_weights_from_a_file_start_the_run(small_spans_root, tmp_path, capsys):
    """A control run (rate 0) from a weights file exports that file's weights: they were loaded."""
    import tf_keras as keras

    from components.train.models import build_model

    keras.utils.set_random_seed(11)
    start = build_model("small_cnn", len(TRAIN_LABELS), 32)
    path = str(tmp_path / "small_cnn.h5")
    start.save_weights(path)
    summary = _train(capsys, small_spans_root, "--run-id", "from-file", "--weights", path, "--learning-rate", "0",
                     "--epochs", "1", "--steps-per-epoch", "2", "--no-xla", "--input-probe-steps", "0")
    exported = {v.name: v.numpy() for v in tf.saved_model.load(summary["model_dir"]).model.variables}
    for variable in start.trainable_variables:
        np.testing.assert_allclose(exported[variable.name], variable.numpy(), rtol=1e-6)  # EMA rounding
    assert summary["warnings"] == []  # pretrained: a short run is fine

    assert train.run(["--root", small_spans_root, "--weights", str(tmp_path / "missing.h5"), "--json"]) == 1
    assert "no such local file" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


def test_application_weights_file_as_keras_applications_writes_it(tmp_path):
    import tf_keras as keras

    from components.train.models import build_model

    base = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), include_top=False, weights=None,
                                               pooling="avg", include_preprocessing=True)
    path = str(tmp_path / "weights_mobilenet_v3_small_notop.h5")
    base.save_weights(path)
    model = build_model("mobilenet_v3_small", 4, 32, weights=path)
    loaded = model.get_layer(base.name).get_weights()
    assert len(loaded) == len(base.get_weights())
    for mine, theirs in zip(loaded, base.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    with pytest.raises(ValueError, match="does not fit this model"):
        build_model("efficientnet_b0", 4, 32, weights=path)


def test_a_broken_span_manifest_is_one_line_naming_it(small_spans_root, tmp_path, capsys):
    root = str(tmp_path / "root")
    shutil.copytree(small_spans_root, root)
    manifest = Root(root).manifest(1)
    with open(manifest, "w") as f:
        f.write('{"span": 1}')
    assert train.run(["--root", root, *TINY, "--json"]) == 1
    captured = capsys.readouterr()
    error = json.loads(captured.out.strip().splitlines()[-1])["error"]
    assert error.startswith(f"{manifest} is not a valid SpanManifest: ")
    assert captured.err.strip() == f"stoke train: error: {error}"


def test_a_span_whose_manifest_changed_after_its_check_is_left_out_and_said_so(small_spans_root, tmp_path, capsys):
    """Training goes on with the spans the data check let in, and names the one it leaves out."""
    from components.contracts.run_config import RunConfig
    from components.train.trainer import find_data

    root = str(tmp_path / "root")
    shutil.copytree(small_spans_root, root, ignore=shutil.ignore_patterns("runs"))
    write_span(root, 2, {"train": tiny_records(8, offset=2000)}, TRAIN_LABELS, {"train": 1})
    with open(Root(root).manifest(2), "ab") as f:
        f.write(b"\n")
    _, train_shards, _, _ = find_data(RunConfig(source=root, root=root).resolved(), "left-out")
    assert {s.span for s in train_shards} == {1}
    err = capsys.readouterr().err
    assert err.startswith("stoke train: warning: left out: span 2 has no valid data-check record (") and err.count("\n") == 1


@pytest.mark.parametrize("debug", [False, True])
def test_tensorflows_python_notices_are_for_stoke_debug(tmp_path, monkeypatch, debug):
    """Keras' "callback is slow compared to the batch time" and TensorFlow's deprecations are no line of
    the run a user can act on; STOKE_DEBUG=1 shows them, and errors show always."""
    import logging

    monkeypatch.setattr(logging.getLogger("tensorflow"), "level", logging.WARNING)
    if debug:
        monkeypatch.setenv("STOKE_DEBUG", "1")
    else:
        monkeypatch.delenv("STOKE_DEBUG", raising=False)
    assert train.run(["--root", str(tmp_path / "no-spans")]) == 1
    assert logging.getLogger("tensorflow").level == (logging.WARNING if debug else logging.ERROR)


@pytest.mark.parametrize("at_epoch", [1, 3], ids=["mid-run", "after-the-last-epoch"])
def test_a_shard_replaced_while_training_stops_the_run_without_a_candidate(small_spans_root, tmp_path, at_epoch):
    """tf.data opens the shards again every epoch: one rewritten after the check (here as an epoch ends) fails
    the run at the next epoch's end, or before the candidate is exported, in one line naming it; the backup,
    which may hold what the run learnt from it, goes too."""
    from components.contracts.run_config import RunConfig
    from components.train import TrainError
    from tests.components.conftest import relabel

    root = str(tmp_path / "root")
    shutil.copytree(small_spans_root, root, ignore=shutil.ignore_patterns("runs"))
    shard = Spans(root).shards("train")[1]
    config = RunConfig(source=root, root=root, preset="cpu", train={
        "network": "small_cnn", "weights": "none", "image_size": 32, "batch_size": 8, "epochs": 3,
        "input_probe_steps": 0, "trace_steps": "none"}).resolved()

    def swap(event):
        if event.done == at_epoch:
            relabel(shard.uri, 0)

    with pytest.raises(TrainError) as stopped:
        train.train(config, run_id="swapped", progress=swap)
    message = str(stopped.value)
    assert "\n" not in message and message.startswith(f"span 1 changed while training read it: {shard.uri} is not "
                                                      "the file checked before training"), message
    run = Root(root).run("swapped")
    assert not any(os.path.exists(p) for p in (run.candidate, run.metrics, run.backup))
