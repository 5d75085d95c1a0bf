"""Strategy, precision and XLA choice from TF_CONFIG and the devices."""
from __future__ import annotations

import json

import pytest

from components.train import placement


def _tf_config(task_type, index, chief=True, workers=2):
    cluster = {"worker": [f"127.0.0.1:{2000 + i}" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["127.0.0.1:1999"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_no_tf_config_means_no_cluster():
    assert placement.parse_tf_config("") is None
    assert placement.parse_tf_config(json.dumps({"cluster": {}, "task": {}})) is None


@pytest.mark.parametrize("task_type, index, chief, is_chief", [
    ("chief", 0, True, True), ("worker", 0, True, False), ("worker", 0, False, True), ("worker", 1, False, False)])
def test_chief_is_the_chief_task_or_worker_zero(task_type, index, chief, is_chief):
    cluster = placement.parse_tf_config(_tf_config(task_type, index, chief))
    assert cluster.is_chief is is_chief
    assert cluster.workers == (3 if chief else 2)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"), (_tf_config("ps", 0), "not in its cluster"), (_tf_config("worker", 5), "out of range")])
def test_bad_tf_config_is_refused_clearly(text, message):
    with pytest.raises(ValueError, match=message):
        placement.parse_tf_config(text)


def test_auto_strategy():
    cluster = placement.parse_tf_config(_tf_config("worker", 1))
    one = placement.parse_tf_config(_tf_config("worker", 0, chief=False, workers=1))
    assert placement.choose_strategy("auto", cluster, 0) == "multi_worker"
    assert placement.choose_strategy("auto", one, 0) == "one_device"
    assert placement.choose_strategy("auto", None, 4) == "mirrored"
    assert placement.choose_strategy("auto", None, 1) == "one_device"
    assert placement.choose_strategy("auto", None, 0) == "one_device"
    assert placement.choose_strategy("mirrored", cluster, 0) == "mirrored"


def test_auto_precision_follows_compute_capability():
    assert placement.choose_precision("auto", []) == "float32"
    assert placement.choose_precision("auto", [(6, 1)]) == "float32"
    assert placement.choose_precision("auto", [(7, 0)]) == "mixed_float16"
    assert placement.choose_precision("auto", [(8, 0), (8, 6)]) == "mixed_bfloat16"
    assert placement.choose_precision("auto", [(8, 0), (7, 5)]) == "mixed_float16"  # the weakest GPU decides
    assert placement.choose_precision("mixed_bfloat16", []) == "mixed_bfloat16"


def test_xla_defaults_on_with_a_gpu_only():
    assert placement.choose_xla(None, 1) is True
    assert placement.choose_xla(None, 0) is False
    assert placement.choose_xla(True, 0) is True


def test_one_device_strategy_on_this_cpu():
    made = placement.make_strategy("one_device", 0)
    assert made.num_replicas_in_sync == 1
    assert made.extended.worker_devices[0].endswith("CPU:0")
