"""The report's Training section says how a fine-tuned run went: its phases, their epochs, steps,
trainable parameters and learning rates."""
from __future__ import annotations

from types import SimpleNamespace

from components.contracts.results import TrainPhase, TrainStart
from components.report.report import _training_lines

PHASE = {"warmup_steps": 8, "batch_norm": "inference", "resumed_from_step": 0}


def _section(phases, weights="imagenet", start=None, network="efficientnet_b0", network_digest=None,
             environment=None):
    probe = {"input_bound": False}
    return SimpleNamespace(network=network, network_digest=network_digest, spans=[1], epochs=30, total_steps=240,
                           strategy="one_device", replicas=1, precision="float32", images_per_sec=50.0, verdict="not measured",
                           eval=SimpleNamespace(accuracy=0.9, loss=0.3), shards=None, data_service=None, profiler=None,
                           weights=weights, phases=[TrainPhase(**PHASE, **p) for p in phases], start=start,
                           environment=environment, **probe)


def test_a_fine_tuned_run_lists_its_phases():
    lines = _training_lines(_section([
        {"name": "head", "epochs": 10, "first_epoch": 1, "steps": 80, "peak_learning_rate": 0.003,
         "trainable_parameters": 3843},
        {"name": "fine_tune", "epochs": 20, "first_epoch": 11, "steps": 160, "peak_learning_rate": 0.0001,
         "trainable_parameters": 4011391}]), {})
    assert ("Fine-tuned from `imagenet`: epochs 1-10 trained the new head alone, the backbone frozen (80 steps, 3,843 "
            "trainable parameters, peak learning rate 0.003); then epochs 11-30 fine-tuned the backbone too (160 steps, "
            "4,011,391 trainable parameters, peak learning rate 0.0001); the backbone's batch normalization kept its "
            "loaded statistics (inference mode) throughout.") in lines


def test_a_run_of_one_phase_says_nothing_more():
    lines = _training_lines(_section([{"name": "all", "epochs": 30, "first_epoch": 1, "steps": 240,
                                       "peak_learning_rate": 0.003, "trainable_parameters": 94083}], "none"), {})
    assert not [line for line in lines if "Fine-tuned" in line]


ALL = [{"name": "all", "epochs": 3, "first_epoch": 1, "steps": 30, "peak_learning_rate": 0.0003,
        "trainable_parameters": 94083}]


def test_a_warm_run_says_from_which_version_and_on_how_many_records():
    start = TrainStart(kind="warm", reason="same network", from_version=7, new_spans=[3], replay_spans=[1, 2],
                       new_records=120, replay_records=130, warm_runs_since_full=2)
    lines = _training_lines(_section(ALL, "none", start), {})
    assert ("Warm start from version 7: 120 new records + 130 replayed (spans [3] new; a sample of [1, 2]).") in lines


def test_a_full_retrain_says_why():
    start = TrainStart(kind="full", reason="new class grey since served version 7", from_version=None,
                       new_spans=[1, 2], replay_spans=[], new_records=80, replay_records=0, warm_runs_since_full=0)
    lines = _training_lines(_section(ALL, "none", start), {})
    assert "Full retrain: new class grey since served version 7." in lines


def test_the_network_is_named_with_the_sha256_of_its_code():
    digest = "3d0b9045e98be68688ba5ca6fdd7578a6d95e4f6984c91b06b4ef5dc686d3d81"
    own = _training_lines(_section([], "none", network="residual.py:network", network_digest=digest), {})
    assert (f"Network `residual.py:network`, its code's SHA-256 `{digest}`; the code it trained with is in `code/` "
            "beside this report.") in own
    assert f"Network `small_cnn`, its code's SHA-256 `{digest}`." in _training_lines(
        _section([], "none", network="small_cnn", network_digest=digest), {})
    assert not any(line.startswith("Network") for line in _training_lines(_section([], "none"), {}))  # none recorded


def test_the_environment_is_said_in_a_line_or_said_to_be_unrecorded():
    from components.contracts.results import Environment

    assert "Environment: not recorded." in _training_lines(_section([]), {})
    environment = Environment(python="3.11.7", tensorflow="2.21.0", tf_keras="2.21.0", beam="2.77.0", tfma="0.52.0",
                              numpy="2.4.6", pillow="12.3.0", cuda="12.5.1", cudnn="9", gpu_driver=None,
                              lock="requirements/runtime.lock", lock_sha256="a1b2c3" + "0" * 58, unlocked=[],
                              packages_sha256="0" * 64)
    assert ("Environment: Python 3.11.7, TensorFlow 2.21.0, Keras (tf_keras) 2.21.0, Beam 2.77.0, TFMA 0.52.0, numpy "
            "2.4.6, Pillow 12.3.0, CUDA 12.5.1, cuDNN 9; lock a1b2c3 (requirements/runtime.lock).") in _training_lines(
        _section([], environment=environment), {})
