"""Where a training process trains: the tf.distribute strategy, this worker's role, precision and XLA.

The choice is made from what the process sees: TF_CONFIG (a cluster of workers), the GPUs and their
compute capability. `auto` is what a user wants on the machine at hand; every explicit value is
honoured as asked, so tests can force each path on the CPU.

Keras: tf_keras (Keras 2) for every strategy. Keras 3's `fit` fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585), and one Keras for all strategies means one
code path to test.
"""
from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf
import tf_keras as keras

from components.contracts.config import TrainConfig
from components.train import TrainError


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The parts of TF_CONFIG training needs."""

    workers: int  # chief + workers
    task_type: str
    task_index: int

    @property
    def pipeline(self) -> int:
        """This worker's input pipeline id: the chief's is 0, and workers follow it."""
        return self.task_index + (1 if self._has_chief and self.task_type == "worker" else 0)

    @property
    def is_chief(self) -> bool:
        # Without a "chief" entry, worker 0 plays the chief (the TF convention).
        return self.task_type == "chief" or (self.task_type == "worker" and self.task_index == 0
                                             and not self._has_chief)

    _has_chief: bool = False


def parse_tf_config(text: str | None = None) -> Cluster | None:
    """The cluster named by TF_CONFIG, or None when it names no cluster of workers."""
    text = os.environ.get("TF_CONFIG") if text is None else text
    if not text or not text.strip():
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"TF_CONFIG is not JSON: {exc}") from None
    cluster = config.get("cluster") or {}
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    if workers == 0:
        return None
    task = config.get("task") or {}
    task_type = task.get("type")
    if task_type not in cluster:
        raise ValueError(f"TF_CONFIG task type {task_type!r} is not in its cluster {sorted(cluster)}")
    task_index = int(task.get("index", 0))
    if not 0 <= task_index < len(cluster[task_type]):
        raise ValueError(f"TF_CONFIG task index {task_index} is out of range for {task_type!r}")
    return Cluster(workers, task_type, task_index, _has_chief=bool(cluster.get("chief")))


def gpus() -> list:
    return tf.config.list_physical_devices("GPU")


def compute_capabilities(devices) -> list[tuple[int, int]]:
    found = []
    for device in devices:
        details = tf.config.experimental.get_device_details(device)
        if details.get("compute_capability"):
            found.append(tuple(details["compute_capability"]))
    return found


def choose_strategy(requested: str, cluster: Cluster | None, gpu_count: int) -> str:
    if requested != "auto":
        return requested
    if cluster is not None and cluster.workers > 1:
        return "multi_worker"
    if gpu_count > 1:
        return "mirrored"
    return "one_device"


def make_strategy(name: str, gpu_count: int) -> tf.distribute.Strategy:
    """Creates the strategy; for multi_worker this must come before any other TensorFlow op."""
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "mirrored":
        if gpu_count:
            return tf.distribute.MirroredStrategy()
        # No GPU: mirror over the logical CPU devices (see split_cpu), which tests use.
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    if name == "one_device":
        # A one-device MirroredStrategy, not OneDeviceStrategy: Keras' BackupAndRestore refuses the
        # latter, and resuming matters more than the little bookkeeping this costs.
        return tf.distribute.MirroredStrategy(["/gpu:0" if gpu_count else "/cpu:0"])
    if name == "default":
        return tf.distribute.get_strategy()
    raise ValueError(f"unknown strategy {name!r}")


def choose_precision(requested: str, capabilities: list[tuple[int, int]]) -> str:
    """auto: bfloat16 on Ampere and newer (no loss scaling), float16 from Volta (7.0), else float32."""
    if requested != "auto":
        return requested
    if not capabilities:
        return "float32"
    lowest = min(capabilities)
    if lowest >= (8, 0):
        return "mixed_bfloat16"
    if lowest >= (7, 0):
        return "mixed_float16"
    return "float32"


def choose_xla(requested: bool | None, gpu_count: int) -> bool:
    return bool(gpu_count) if requested is None else requested


def split_cpu(count: int) -> None:
    """Splits the CPU into `count` logical devices; must run before TensorFlow initializes."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have != count:
            raise RuntimeError(f"TensorFlow already runs with {have} logical CPU devices; "
                               f"train.cpu_devices {count} must be set before it starts") from None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the run trains: the tf.distribute strategy, this worker's role, precision and XLA."""
    strategy: tf.distribute.Strategy
    strategy_name: str
    workers: int
    pipeline: int  # this worker's input pipeline id
    is_chief: bool
    precision: str
    xla: bool

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def place(train: TrainConfig, run_id: str | None) -> Placement:
    """Sets up the devices, the strategy and the global Keras policy (precision, seed)."""
    # Devices and the strategy come first: MultiWorkerMirroredStrategy and logical devices must be
    # set up before TensorFlow runs any op.
    try:
        if train.cpu_devices:
            split_cpu(train.cpu_devices)
        cluster = parse_tf_config()
    except (RuntimeError, ValueError) as exc:
        raise TrainError(str(exc)) from None
    found = gpus()
    strategy_name = choose_strategy(train.strategy, cluster, len(found))
    if strategy_name == "multi_worker" and cluster is None:
        raise TrainError("train.strategy multi_worker needs TF_CONFIG naming the cluster and this task")
    if strategy_name == "multi_worker" and not run_id:
        raise TrainError("multi-worker training needs a run id: every worker must resume the same run")
    multi = strategy_name == "multi_worker"
    placement = Placement(
        strategy=make_strategy(strategy_name, len(found)), strategy_name=strategy_name,
        workers=cluster.workers if multi else 1, pipeline=cluster.pipeline if multi else 0,
        is_chief=not multi or cluster.is_chief,
        precision=choose_precision(train.precision, compute_capabilities(found)),
        xla=choose_xla(train.xla, len(found)))
    keras.mixed_precision.set_global_policy(placement.precision)
    if train.seed is not None:
        keras.utils.set_random_seed(train.seed)  # Python, NumPy and TensorFlow: initialisation, dropout
    return placement
