"""Fine-tuning a pretrained backbone (components/train/recipe.py) from a local weights file, as
keras.applications writes one: the head alone first, then the backbone, batch norm kept as loaded; and
ImageNet weights that cannot be had stop a run in seconds, before anything is built or written."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from components.common import pretrained
from components.train import TrainError, models
from components.train import trainer as train
from tests.components.train.test_train import _env, finish

# mobilenet_v3_small at 32 px: the smallest keras.applications backbone, quick on a CPU.
NET = ["--network", "mobilenet_v3_small", "--image-size", "32", "--batch-size", "8", "--input-probe-steps", "2",
       "--trace-steps", "none", "--no-xla", "--seed", "3"]


@pytest.fixture(scope="module")
def backbone_file(tmp_path_factory) -> str:
    """A backbone saved as keras.applications saves its *_notop.h5: include_top=False, its own weights."""
    import tf_keras as keras

    keras.utils.set_random_seed(5)
    base = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), include_top=False, weights=None,
                                               pooling="avg", include_preprocessing=True)
    # Moving statistics unlike a fresh layer's (0 and 1), so keeping them as loaded is visible.
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            mean, variance = layer.moving_mean, layer.moving_variance
            mean.assign(np.random.default_rng(1).normal(0, 0.1, mean.shape))
            variance.assign(np.random.default_rng(2).uniform(0.5, 1.5, variance.shape))
    path = str(tmp_path_factory.mktemp("backbone") / "weights_mobilenet_v3_small_notop.h5")
    base.save_weights(path)
    return path


def _variables(model_dir: str) -> dict[str, np.ndarray]:
    return {v.name: v.numpy() for v in tf.saved_model.load(model_dir).model.variables}


def _file_variables(path: str) -> dict[str, np.ndarray]:
    import tf_keras as keras

    base = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), include_top=False, weights=path,
                                               pooling="avg", include_preprocessing=True)
    return {v.name: v.numpy() for v in base.variables}


def _summary(capsys, root, *args) -> dict:
    code = train.run(["--root", root, *NET, "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out[-1]
    return json.loads(out[-1])


@pytest.fixture(scope="module")
def resumed(small_spans_root, backbone_file) -> dict:
    """A run fine-tuned from the file, mirrored over two logical CPUs in mixed bfloat16 with the weight
    average, killed while fine-tuning (SIGKILL, no cleanup), then run again."""
    # No input probe: no test here reads it, and after the run it would drive the fine-tuning step again
    # (test_train.py's mirrored run probes under a strategy).
    args = ["--run-id", "resume-fine", "--weights", backbone_file, "--epochs", "3", "--backup-every", "2",
            "--strategy", "mirrored", "--cpu-devices", "2", "--precision", "mixed_bfloat16", "--ema",
            "--input-probe-steps", "0"]

    def spawn(**env):
        return subprocess.Popen([sys.executable, "-m", "components.train", "--root", small_spans_root, *NET, "--json",
                                 *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**env))

    killed = spawn(STOKE_KILL_AT_STEP="8")  # a global batch of 16: the head's 3 steps, then 5 of fine-tuning
    finish(killed, 600)
    backup = os.path.join(small_spans_root, "runs", "resume-fine", "backup")
    left = sorted(os.listdir(backup))
    out, err = finish(spawn(), 600)
    assert out.strip(), err[-3000:]
    return {"killed": killed.returncode, "left": left, "summary": json.loads(out.strip().splitlines()[-1]),
            "backup": backup}


def test_a_local_backbone_is_fine_tuned_head_first_then_all_of_it(resumed, backbone_file):
    summary = resumed["summary"]
    head, fine = summary["phases"]
    steps = 48 // 16
    assert (summary["strategy"], summary["replicas"], summary["precision"]) == ("mirrored", 2, "mixed_bfloat16")
    assert (head["name"], head["epochs"], head["first_epoch"], head["steps"]) == ("head", 1, 1, steps)  # a third
    assert (fine["name"], fine["epochs"], fine["first_epoch"], fine["steps"]) == ("fine_tune", 2, 2, 2 * steps)
    assert (head["peak_learning_rate"], fine["peak_learning_rate"]) == (3e-3, 1e-4)
    assert head["trainable_parameters"] == 576 * 3 + 3  # the logits alone: the backbone was frozen
    assert fine["trainable_parameters"] > 100 * head["trainable_parameters"]
    assert head["batch_norm"] == fine["batch_norm"] == "inference"
    assert summary["weights"] == summary["weights_file"] == backbone_file and summary["warnings"] == []


def test_batch_norm_keeps_the_loaded_statistics_while_the_backbone_is_fine_tuned(resumed, backbone_file):
    exported, loaded = _variables(resumed["summary"]["model_dir"]), _file_variables(backbone_file)
    statistics = [name for name in loaded if "moving_" in name]
    assert statistics and all(np.array_equal(exported[name], loaded[name]) for name in statistics)
    kernels = [name for name in loaded if name.endswith("kernel:0")]
    assert any(not np.array_equal(exported[name], loaded[name]) for name in kernels)  # fine-tuned


def test_a_run_killed_while_fine_tuning_resumes_fine_tuning(resumed):
    assert resumed["killed"] == -signal.SIGKILL and resumed["left"] == ["fine_tune", "head", "start.json"]
    summary = resumed["summary"]
    head, fine = summary["phases"]
    assert head["resumed_from_step"] == 3  # finished: its fit restored it and ran no epoch
    assert fine["resumed_from_step"] == 4  # the fine-tuning backup before the kill, one step into epoch 3
    assert summary["resumed_from_step"] == 7 and summary["total_steps"] == 9
    assert len(summary["history"]["loss"]) == 1  # the rest of epoch 3
    assert max(summary["history"]["learning_rate"]) <= 1e-4  # the fine-tuning schedule's, not the head's
    assert not os.path.exists(resumed["backup"])  # the kept head backup goes once the run is done, folder and all


@pytest.mark.parametrize("weights, network, head_epochs, phases", [
    ("imagenet", "efficientnet_b0", None, [("head", 0, 10, 3e-3), ("fine_tune", 10, 20, 1e-4)]),  # a third first
    ("/w.h5", "resnet50", 0, [("fine_tune", 0, 30, 1e-4)]),
    ("/w.h5", "mobilenet_v3_small", 30, [("head", 0, 30, 3e-3)]),  # as many as the epochs: the head alone
    ("/w.h5", "mobilenet_v3_small", 40, [("head", 0, 30, 3e-3)]),
    ("none", "efficientnet_b0", None, [("all", 0, 30, 3e-3)]),
    ("/small_cnn.h5", "small_cnn", None, [("all", 0, 30, 3e-3)]),  # a whole small_cnn: it names no backbone
])
def test_the_phases_follow_the_weights_and_head_epochs(weights, network, head_epochs, phases):
    from components.contracts.config import TrainConfig
    from components.train.recipe import plan_phases

    planned = plan_phases(TrainConfig(network=network, weights=weights, head_epochs=head_epochs), 30, 8,
                          has_backbone=network != "small_cnn")
    assert [(p.name, p.first_epoch, p.epochs, p.learning_rate) for p in planned] == phases
    assert all(p.steps == 8 * p.epochs and p.warmup == min(8, p.steps // 5) for p in planned)


def test_imagenet_weights_that_cannot_be_had_stop_the_run_in_one_line_before_anything(
        small_spans_root, tmp_path, monkeypatch, capsys):
    """The production preset on a machine without the weights: an empty Keras cache, and an address that
    does not answer (this machine reaches no storage bucket)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    (tmp_path / "keras").mkdir()
    code = train.run(["--root", small_spans_root, "--run-id", "no-weights", "--preset", "production", "--json"])
    out, err = capsys.readouterr()
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert code == 1 and "\n" not in error and "Traceback" not in err
    assert error.startswith("train.weights imagenet: efficientnet_b0's ImageNet weights are not in the Keras cache "
                            f"({tmp_path / 'keras' / 'models' / 'efficientnetb0_notop.h5'})")
    assert "set train.weights to a local Keras .h5 such as efficientnetb0_notop.h5" in error
    ways_out = error.split("; train offline: ")[1]
    assert "or to none (from scratch), or use the cpu preset" in ways_out
    # ...in the form of either command that printed it: by hand, or through stoke run
    assert ways_out.endswith("stoke train --weights PATH, --weights none or --preset cpu; "
                             "stoke run --set train.weights=PATH, --set train.weights=none or --preset cpu")
    assert os.listdir(os.path.join(small_spans_root, "runs", "no-weights")) == []  # nothing built or written
    assert not os.listdir(tmp_path / "keras" / "models")  # no half-downloaded file left


def test_a_cached_copy_is_used_only_when_its_hash_matches(tmp_path, monkeypatch):
    """A file of the right name in the cache is not trusted on its name: a wrong one is fetched again."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    name = pretrained.IMAGENET["mobilenet_v3_small"][0]
    cached = tmp_path / "models" / name
    cached.write_bytes(b"not the weights")
    with pytest.raises(TrainError, match="could not be fetched"):
        models.initial_weights("imagenet", "mobilenet_v3_small")
    assert not cached.exists()  # Keras' download replaces it, and a failed one leaves nothing
    cached.write_bytes(b"the weights, as far as this test knows")
    monkeypatch.setitem(pretrained.IMAGENET, "mobilenet_v3_small", (name, "unused", pretrained.file_md5(str(cached))))
    assert models.initial_weights("imagenet", "mobilenet_v3_small") == str(cached)
    assert pretrained.cached_file("mobilenet_v3_small") == str(cached)  # what preflight asks, without a download


def test_a_download_that_never_answers_gives_up_after_the_timeout(tmp_path, monkeypatch):
    """A firewall that drops packets, played by a socket that accepts and never answers."""
    import socket

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with socket.create_server(("127.0.0.1", 0)) as server:
        origin = f"http://127.0.0.1:{server.getsockname()[1]}/efficientnetb0_notop.h5"
        with pytest.raises(TrainError, match="timed out"):
            models.imagenet_file("efficientnet_b0", timeout=0.5, origin=origin)
    assert not os.path.exists(tmp_path / "models" / "efficientnetb0_notop.h5")


@pytest.mark.parametrize("weights, code, error", [
    ("imagenet", 1, "train.network small_cnn has no ImageNet weights"),
    ("/nowhere/w.h5", 1, "train.weights /nowhere/w.h5: no such local file"),
    # The setting's shape is checked where it is read (exit 2): a URI, or a file that is no .h5.
    ("s3://bucket/w.h5", 2, "none, imagenet or the path of a local Keras .h5 weights file"),
    ("file:///w.h5", 2, "none, imagenet or the path of a local Keras .h5 weights file"),
    ("/w.keras", 2, "none, imagenet or the path of a local Keras .h5 weights file"),
    ("ImageNet", 2, "none, imagenet or the path of a local Keras .h5 weights file"),
])
def test_weights_a_network_cannot_start_from_are_refused_first(small_spans_root, weights, code, error, capsys):
    assert train.run(["--root", small_spans_root, "--network", "small_cnn", "--weights", weights, "--json"]) == code
    assert error in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
