"""`python -m components.train --root ROOT ...`: published spans to a candidate SavedModel.

One process per worker, the same program everywhere: the strategy (components/train/strategy.py) comes
from TF_CONFIG and the devices, the input from components/train/input_pipeline.py. Artifacts go to
ROOT/runs/<run-id>/: checkpoints (best by eval loss), backup (BackupAndRestore: rerunning the same
run id resumes at the last backed-up step), tensorboard, candidate, metrics.json, curves.png.
Only the chief writes them; other workers write their copies to temporary folders and delete them,
which is how tf.distribute expects multi-worker saving to go.

After training, a short probe (components/train/probe.py) answers "was the accelerator waiting for
input?": the input pipeline's rate alone against the model's step rate on one in-memory batch.
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import sys
import tempfile

import tensorflow as tf
import tf_keras as keras

from components.common import clock
from components.common.files import exists, join
from components.contracts import program
from components.contracts.config import (
    DEFAULT_BATCH,
    MIN_STEPS_PER_EPOCH,
    SMALL_BATCH,
    TrainConfig,
    from_arguments,
)
from components.contracts.layout import Root, RunDir, parse_spans
from components.contracts.results import ResultError, TrainMetrics
from components.train import profile
from components.train.gpu_sampler import GpuSampler
from components.train.probe import StepTimer, input_probe

# Fault drill: with this set to N, the process kills itself (SIGKILL, no cleanup) once N training
# steps are done, so resume from backup can be tested the way a preempted machine fails.
KILL_AT_STEP_ENV = "STOKE_KILL_AT_STEP"


class TrainError(Exception):
    """A refusal with a message for the user (no traceback)."""


def run(argv: list[str] | None = None) -> int:
    args = program.arguments("stoke train", __doc__, TrainConfig).parse_args(argv)
    return program.main("stoke train", args.json, lambda: train(from_arguments(TrainConfig, args)),
                        _describe, errors=(TrainError, ResultError))


def _describe(summary: dict) -> str:
    return (f"trained {summary['model']} for {summary['total_steps']} steps: "
            f"eval accuracy {summary['eval'].get('accuracy')}, candidate {summary['model_dir']}"
            + "".join(f"\nwarning: {warning}" for warning in summary.get("warnings") or []))


def train(config: TrainConfig) -> dict:
    """Trains per `config` and returns the summary (also written to metrics.json by the chief)."""
    from components.train import input_pipeline as pipeline
    from components.train import models, recipe
    from components.train import strategy as strategies
    from components.train.export import export_candidate

    # Devices and the strategy come first: MultiWorkerMirroredStrategy and logical devices must be
    # set up before TensorFlow runs any op.
    try:
        if config.cpu_devices:
            strategies.split_cpu(config.cpu_devices)
        cluster = strategies.parse_tf_config()
    except (RuntimeError, ValueError) as exc:
        raise TrainError(str(exc)) from None
    gpus = strategies.gpus()
    strategy_name = strategies.choose_strategy(config.strategy, cluster, len(gpus))
    if strategy_name == "multi_worker" and cluster is None:
        raise TrainError("--strategy multi_worker needs TF_CONFIG naming the cluster and this task")
    if strategy_name == "multi_worker" and not config.run_id:
        raise TrainError("multi-worker training needs --run-id: every worker must resume the same run")
    strategy = strategies.make_strategy(strategy_name, len(gpus))
    workers = cluster.workers if strategy_name == "multi_worker" else 1
    is_chief = strategy_name != "multi_worker" or cluster.is_chief
    precision = strategies.choose_precision(config.precision, strategies.compute_capabilities(gpus))
    xla = strategies.choose_xla(config.xla, len(gpus))
    keras.mixed_precision.set_global_policy(precision)
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)  # Python, NumPy and TensorFlow: initialisation, dropout

    root = Root(config.root)
    try:
        tf.io.gfile.exists(root.uri)
    except tf.errors.UnimplementedError:
        # tf.data and Keras' checkpoints go through TensorFlow's own file systems, not fsspec.
        raise TrainError(f"TensorFlow cannot read or write {root.uri}: use a local path or gs:// "
                         "(s3:// needs the tensorflow-io package)") from None
    try:
        spans = parse_spans(config.spans)
        run = root.run(config.run_id or clock.run_id())
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    train_shards = root.shards("train", spans)
    eval_shards = root.shards("eval", spans)
    if not train_shards:
        raise TrainError(f"no published span with training records under {root.spans}"
                         + (f" among spans {config.spans}" if spans else "") + "; run `stoke ingest` first")
    labels = root.label_names(spans)
    stored = min((m.max_side for m in root.manifests(spans) if m.max_side), default=None)
    if stored and config.image_size > stored:
        print(f"stoke train: warning: --image-size {config.image_size} is larger than the spans hold (ingested "
              f"with --max-side {stored}), so images are upsampled; for sharper inputs, ingest the source into "
              "a new ROOT with a larger --max-side", file=sys.stderr, flush=True)
    if exists(run.metrics):
        raise TrainError(f"run {run.run_id} already finished ({run.metrics}); choose a new --run-id")

    # Corrupt shards: with --skip-corrupt, count what is unreadable now and train on the rest.
    corrupt = []
    train_records = sum(s.records for s in train_shards)
    eval_records = sum(s.records for s in eval_shards)
    if config.skip_corrupt:
        scans = pipeline.scan_shards(train_shards + eval_shards)
        corrupt = [s for s in scans if s.error]
        train_records = sum(s.readable for s in scans[:len(train_shards)])
        eval_records = sum(s.readable for s in scans[len(train_shards):])

    replicas = strategy.num_replicas_in_sync
    batch_size = config.batch_size or default_batch(train_records, replicas)
    global_batch = batch_size * replicas
    steps_per_epoch = train_records // global_batch
    if steps_per_epoch == 0:
        raise TrainError(f"{train_records} training records make no full batch of {global_batch} "
                         f"({batch_size} x {replicas} replicas); lower --batch-size")
    if config.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, config.steps_per_epoch)
    validation_steps = math.ceil(eval_records / global_batch) if eval_records else 0
    total = config.epochs * steps_per_epoch
    warmup = recipe.warmup_steps(config.warmup_epochs, steps_per_epoch, total) if config.schedule == "cosine" else 0

    def dataset_fn(shards, training):
        cache = config.cache
        if cache and cache != "memory":
            cache = f"{cache}-{'train' if training else 'eval'}"

        def make(context: tf.distribute.InputContext):
            options = pipeline.PipelineOptions(
                image_size=config.image_size, batch_size=context.get_per_replica_batch_size(global_batch),
                training=training, cache=cache, skip_corrupt=config.skip_corrupt, flip=config.flip,
                shuffle_buffer=config.shuffle_buffer,
                seed=None if config.seed is None else config.seed + context.input_pipeline_id)
            return pipeline.make_dataset(shards, options, context)
        return make

    train_data = strategy.distribute_datasets_from_function(dataset_fn(train_shards, True))
    eval_data = (strategy.distribute_datasets_from_function(dataset_fn(eval_shards, False))
                 if validation_steps else None)

    with strategy.scope():
        try:
            model = models.build_model(config.model, len(labels), config.image_size, config.weights)
        except ValueError as exc:
            raise TrainError(str(exc)) from None
        optimizer = recipe.make_optimizer(recipe.learning_rate(config.schedule, config.learning_rate, warmup, total),
                                          config.weight_decay, config.ema_momentum if config.ema else None)
        models.compile_model(model, optimizer, recipe.make_loss(len(labels), config.label_smoothing),
                             xla, config.steps_per_execution)

    # Other workers write their copies into a scratch folder of the same layout, deleted at the end.
    scratch = [] if is_chief else [tempfile.mkdtemp(prefix="stoke-worker-")]
    mine = run if is_chief else RunDir(scratch[0])
    profiled = _profile_range(config.profile_steps)
    timer = StepTimer(skip=profiled)
    resume = ResumePoint()
    callbacks = [
        keras.callbacks.BackupAndRestore(run.backup, save_freq=config.backup_every or "epoch"),
        resume,
        keras.callbacks.ModelCheckpoint(
            join(run.checkpoints, "best"), monitor="val_loss" if eval_data else "loss",
            save_best_only=True, save_weights_only=True),
        keras.callbacks.TensorBoard(mine.tensorboard, profile_batch=profiled),
        timer,
        recipe.LearningRateLog(),
    ]
    if config.ema:
        # First, so every later callback (checkpoints, TensorBoard) sees the validation of the average.
        callbacks.insert(0, recipe.EmaEvaluation())
    if os.environ.get(KILL_AT_STEP_ENV):
        callbacks.append(KillAtStep(int(os.environ[KILL_AT_STEP_ENV])))

    try:
        with GpuSampler() as sampler:  # each worker samples its own GPUs; nothing without NVML
            history = model.fit(train_data, epochs=config.epochs, steps_per_epoch=steps_per_epoch,
                                validation_data=eval_data, validation_steps=validation_steps or None,
                                callbacks=callbacks, verbose=2)
    except tf.errors.DataLossError:
        bad = [s for s in pipeline.scan_shards(train_shards + eval_shards) if s.error]
        if not bad:
            raise
        raise TrainError(str(pipeline.CorruptShardError(bad))) from None
    total_steps = int(model.optimizer.iterations.numpy())

    # fit() ends by copying the average into the model's trainable weights (tf_keras'
    # finalize_variable_values), so with EMA these are the averaged weights.
    candidate = mine.candidate
    export_candidate(model_name=config.model, weights=model.get_weights(), labels=labels,
                     image_size=config.image_size, path=candidate)

    probe = {}
    if config.probe_steps:
        probe = input_probe(model, strategy, train_shards, config, global_batch, workers,
                            real_step_seconds=timer.step_seconds(), steps=total_steps - resume.step)

    epochs = history.history
    metrics = TrainMetrics.model_validate({
        "run_id": run.run_id,
        "run_dir": run.uri,
        "model_dir": run.candidate,
        "model": config.model,
        "image_size": config.image_size,
        "labels": labels,
        "spans": sorted({s.span for s in train_shards + eval_shards}),
        "strategy": strategy_name,
        "workers": workers,
        "replicas": replicas,
        "precision": precision,
        "xla": xla,
        "batch_size": batch_size,
        "global_batch_size": global_batch,
        "epochs": config.epochs,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "resumed_from_step": resume.step,
        "images_per_sec": timer.images_per_sec(global_batch),
        "train": {"loss": _last(epochs, "loss"), "accuracy": _last(epochs, "accuracy")},
        "eval": {"loss": _last(epochs, "val_loss"), "accuracy": _last(epochs, "val_accuracy")},
        "history": {key: [float(v) for v in values] for key, values in epochs.items()},
        "exported_weights": "ema" if config.ema else "final",
        "schedule": {"kind": config.schedule, "peak_learning_rate": config.learning_rate, "warmup_steps": warmup,
                     "decay_steps": total - warmup, "weight_decay": config.weight_decay,
                     "label_smoothing": config.label_smoothing,
                     "ema_momentum": config.ema_momentum if config.ema else None},
        "seed": config.seed,
        "best_epoch": _best_epoch(epochs, first=resume.step // steps_per_epoch + 1),
        "warnings": short_run_warnings(total, config.weights),
        "input": probe,
        "gpu": sampler.to_dict(),
        "profiler": profile.input_pipeline_verdict(mine.tensorboard) if profiled else None,
        "corrupt": {"skipped_records": sum(s.lost for s in corrupt),
                    "shards": [{"uri": s.uri, "error": s.error, "readable": s.readable,
                                "expected": s.expected} for s in corrupt]},
    })
    if is_chief:
        _plot_curves(epochs, run.curves)
        metrics.write(run.metrics)  # last: its presence marks the run finished
    for folder in scratch:
        shutil.rmtree(folder, ignore_errors=True)
    return metrics.to_json()


class ResumePoint(keras.callbacks.Callback):
    """The optimizer step training started from (after BackupAndRestore restored it)."""

    def __init__(self):
        super().__init__()
        self.step = 0

    def on_train_begin(self, logs=None):
        self.step = int(self.model.optimizer.iterations.numpy())


class KillAtStep(keras.callbacks.Callback):
    def __init__(self, step: int):
        super().__init__()
        self.at = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def _profile_range(text: str):
    if text.strip().lower() in ("", "none", "0", "off"):
        return 0
    try:
        first, last = (int(part) for part in text.split(","))
    except ValueError:
        raise TrainError(f"--profile-steps takes two step numbers such as 10,20 (or none), not {text!r}") from None
    return (first, last)


def default_batch(train_records: int, replicas: int) -> int:
    """DEFAULT_BATCH, halved while an epoch would have fewer than MIN_STEPS_PER_EPOCH steps (not
    below SMALL_BATCH): batch-norm statistics and the schedule need steps more than big batches."""
    batch = DEFAULT_BATCH
    while batch > SMALL_BATCH and train_records // (batch * replicas) < MIN_STEPS_PER_EPOCH:
        batch //= 2
    return batch


def short_run_warnings(total_steps: int, weights: str) -> list[str]:
    from components.train.recipe import MIN_STEPS

    if weights == "none" and total_steps < MIN_STEPS:
        return [f"only {total_steps} training steps: a model trained from scratch rarely converges in fewer "
                f"than {MIN_STEPS}; train more epochs, or on more data"]
    return []


def _best_epoch(history: dict, first: int) -> dict | None:
    """The epoch (counted from 1; a resumed history starts at `first`) with the best eval accuracy,
    as the run reported it: informational, the candidate is always the end of the run."""
    values = history.get("val_accuracy")
    if not values:
        return None
    index = max(range(len(values)), key=values.__getitem__)
    return {"epoch": first + index, "accuracy": float(values[index]), "loss": float(history["val_loss"][index])}


def _last(history: dict, key: str):
    values = history.get(key)
    return float(values[-1]) if values else None


def _plot_curves(history: dict, uri: str) -> None:
    from components.common import plots

    fig, axes = plots.pyplot().subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("loss", "accuracy")):
        for key, style in ((metric, "-"), (f"val_{metric}", "--")):
            if history.get(key):
                ax.plot(range(1, len(history[key]) + 1), history[key], style, marker="o", label=key)
        ax.set_xlabel("epoch")
        ax.set_title(metric)
        ax.legend()
    plots.save(fig, uri)
