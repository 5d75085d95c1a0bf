"""`python -m components.train --root ROOT ...`: published spans to a candidate SavedModel.

One process per worker, the same program everywhere: the strategy (components/train/strategy.py) comes
from TF_CONFIG and the devices, the input from components/train/input_pipeline.py. Artifacts go to
ROOT/runs/<run-id>/: backup (BackupAndRestore: rerunning the same run id resumes at the last
backed-up step), tensorboard, candidate, metrics.json, curves.png.
Only the chief writes them; other workers write their copies to temporary folders and delete them,
which is how tf.distribute expects multi-worker saving to go.

After training, a short probe (components/train/probe.py) answers "was the accelerator waiting for
input?": the input pipeline's rate alone against the model's step rate on one in-memory batch.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable

import tensorflow as tf
import tf_keras as keras

from components.common import program
from components.common.files import write_json
from components.common.local_copies import UnsafeKey
from components.common.shard_scan import scan_shards
from components.common.store_errors import on_root
from components.contracts import presets
from components.contracts.config import trace_range
from components.contracts.layout import RunDir, Shard
from components.contracts.results import ResultError, TrainMetrics
from components.contracts.run_config import TrainSettings
from components.contracts.summaries import Progress
from components.train import profile, remote_root
from components.train.gpu_sampler import GpuSampler
from components.train.plan import RunPlan, TrainError, resolve
from components.train.probe import StepTimer, input_probe

# Fault drill: with this set to N, the process kills itself (SIGKILL, no cleanup) once N training
# steps are done, so resume from backup can be tested the way a preempted machine fails.
KILL_AT_STEP_ENV = "STOKE_KILL_AT_STEP"


def run(argv: list[str] | None = None) -> int:
    args = program.stage_arguments("train", argv)
    # Progress events with --json only: for people, Keras prints "Epoch N/M" itself.
    progress = program.progress_printer(as_json=True) if args.json else None
    return program.main("stoke train", args.json,
                        on_root(lambda config: train(config, progress),
                                lambda: _with_preset(program.stage_settings("train", args))),
                        _describe, errors=(TrainError, ResultError, UnsafeKey, OSError))


def _with_preset(settings: TrainSettings) -> TrainSettings:
    """By hand, the settings left unset take the preset's values (the flow's settings file has them already)."""
    return presets.fill(settings.preset, "train", settings)


def _describe(summary: dict) -> str:
    return (f"trained {summary['network']} for {summary['total_steps']} steps: "
            f"eval accuracy {summary['eval'].get('accuracy')}, candidate {summary['model_dir']}"
            + "".join(f"\nwarning: {warning}" for warning in summary.get("warnings") or []))


def train(config: TrainSettings, progress: Callable[[Progress], None] | None = None) -> dict:
    """Trains per `config` and returns the summary (also written to metrics.json by the chief);
    the chief hands `progress` an event at the end of each epoch."""
    from components.train.export import export_candidate

    plan = resolve(config)
    model, train_data, eval_data = build(config, plan)
    # Other workers write their copies into a scratch folder of the same layout, deleted at the end.
    scratch = [] if plan.placement.is_chief else [tempfile.mkdtemp(prefix="stoke-worker-")]
    mine = plan.work if plan.placement.is_chief else RunDir(scratch[0])
    remote_root.resume_from(plan.run, plan.work)
    fitted = fit(config, plan, model, train_data, eval_data, mine, progress if plan.placement.is_chief else None)
    # fit() ends by copying the average into the model's trainable weights (tf_keras'
    # finalize_variable_values), so with EMA these are the averaged weights.
    export_candidate(network=config.network, weights=model.get_weights(), labels=plan.labels,
                     image_size=config.image_size, path=mine.candidate)
    probe = {}
    if config.input_probe_steps:
        probe = input_probe(model, plan.placement.strategy, plan.train_shards, config, plan.global_batch,
                            plan.placement.workers, real_step_seconds=fitted.step_seconds,
                            steps=fitted.total_steps - fitted.resumed_from_step)
    metrics = summarize(config, plan, fitted, probe, _service_at_end(plan.data_service))
    if plan.placement.is_chief:
        remote_root.upload_candidate(plan.work, plan.run)
        _plot_curves(fitted.history, plan.run.curves)
        write_json(plan.run.metrics, metrics.to_json())  # last: its presence marks the run finished
    for folder in scratch:
        shutil.rmtree(folder, ignore_errors=True)
    return metrics.to_json()


def build(config: TrainSettings, plan: RunPlan):
    """The model, from the plan's weights file or from scratch, and the distributed train and eval datasets
    (None without eval records); each phase compiles the model itself (components/train/phases.py)."""
    from components.train import models, phases

    strategy = plan.placement.strategy
    train_data = strategy.distribute_datasets_from_function(_dataset_fn(config, plan, plan.train_shards, True))
    eval_data = (strategy.distribute_datasets_from_function(_dataset_fn(config, plan, plan.eval_shards, False))
                 if plan.validation_steps else None)
    with strategy.scope():
        try:
            model = models.build_model(config.network, len(plan.labels), config.image_size, plan.start,
                                       fine_tuning=phases.pretrained(config))
        except ValueError as exc:
            raise TrainError(str(exc)) from None
    return model, train_data, eval_data


def _dataset_fn(config: TrainSettings, plan: RunPlan, shards: list[Shard], training: bool):
    """The per-input-pipeline dataset function tf.distribute calls once per worker; evaluation's
    batches hold every eval record once, weighted, then blanks (components/train/eval_batches.py)."""
    from components.train import eval_batches, image_cache
    from components.train import input_pipeline as pipeline

    service = plan.data_service if training else None

    def make(context: tf.distribute.InputContext):
        # Each replica of this worker takes one batch per step.
        replicas = context.num_replicas_in_sync // context.num_input_pipelines
        options = pipeline.PipelineOptions(
            image_size=config.image_size, batch_size=context.get_per_replica_batch_size(plan.global_batch),
            training=training, cache=config.image_cache, skip_corrupt=config.skip_corrupt, flip=config.flip,
            shuffle_buffer=config.shuffle_buffer,
            seed=None if config.seed is None else config.seed + context.input_pipeline_id,
            eval_batches=None if training else plan.validation_steps * replicas,
            eval_weight=1.0 if training else eval_batches.record_weight(
                plan.eval_records, plan.validation_steps, plan.global_batch),
            exclude=plan.excluded if training else ())
        if options.cache not in (None, "memory"):
            options = dataclasses.replace(options, cache=image_cache.claim(options.cache, "train" if training else "eval",
                                                                           image_cache.key(shards, options, context)))
        if service:  # trainers of one multi-worker run share one job of the service: one dataset, one seed
            job = f"stoke-{plan.run.run_id}" if plan.placement.workers > 1 else None
            return _through_service(shards, dataclasses.replace(options, seed=config.seed), service["address"], job)
        return pipeline.make_dataset(shards, options, context)
    return make


def _through_service(shards: list[Shard], options, address: str, job: str | None):
    """Training batches from the tf.data service (components/train/service_input.py): the workers run
    the whole pipeline, unsharded (the dispatcher shares the files out), up to the batch."""
    from components.train import input_pipeline as pipeline
    from components.train import service_input

    return service_input.through_service(pipeline.make_dataset(shards, options), address, job)


@dataclasses.dataclass(frozen=True)
class Fitted:
    """What model.fit() leaves for the summary."""
    history: dict  # Keras' per-epoch logs, the phases one after the other
    total_steps: int
    resumed_from_step: int
    step_seconds: float | None  # of the last phase: the steps the input probe's model makes
    images_per_sec: float | None
    gpu: dict
    profiler: dict | None
    phases: list[dict]  # results.TrainPhase


def fit(config: TrainSettings, plan: RunPlan, model, train_data, eval_data, mine: RunDir,
        progress: Callable[[Progress], None] | None = None) -> Fitted:
    """Runs model.fit() once per phase (components/train/phases.py) with the run's callbacks; a bad CRC
    becomes a TrainError naming the shard."""
    from components.train import input_pipeline as pipeline
    from components.train import phases

    profiled = _profile_range(config.trace_steps)
    shown = EpochProgress(plan.epochs, progress) if progress else None
    history, done, resumed, records = {}, 0, 0, []
    try:
        with GpuSampler() as sampler:  # each worker samples its own GPUs; nothing without NVML
            for phase in plan.phases:
                last = phase is plan.phases[-1]
                phases.prepare(model, phase, config, len(plan.labels), plan.placement.xla)
                timer, resume = StepTimer(skip=profiled if last else 0), ResumePoint()
                callbacks = _callbacks(config, plan, phase, mine, profiled if last else 0, timer, resume, done)
                logs = model.fit(train_data, initial_epoch=phase.first_epoch, epochs=phase.end_epoch,
                                 steps_per_epoch=plan.steps_per_epoch, validation_data=eval_data,
                                 validation_steps=plan.validation_steps or None,
                                 callbacks=callbacks + ([shown] if shown else []), verbose=2)
                history = phases.merged(history, logs.history)
                done, resumed = done + int(model.optimizer.iterations.numpy()), resumed + resume.step
                records.append(_phase_record(model, phase, resume.step))
    except tf.errors.DataLossError:
        bad = [s for s in scan_shards(plan.train_shards + plan.eval_shards) if s.error]
        if not bad:
            raise
        raise TrainError(str(pipeline.CorruptShardError(bad))) from None
    if plan.placement.is_chief:
        phases.drop_backups(plan.work, plan.run, plan.phases)
    return Fitted(history=history, total_steps=done, resumed_from_step=resumed, step_seconds=timer.step_seconds(),
                  images_per_sec=timer.images_per_sec(plan.global_batch), gpu=sampler.to_dict(),
                  profiler=profile.input_pipeline_verdict(mine.tensorboard) if profiled else None, phases=records)


def _phase_record(model, phase, resumed: int) -> dict:
    """The phase as metrics.json records it (results.TrainPhase)."""
    from components.train import models, phases

    frozen_statistics = phase.name != "all" and models.backbone(model) is not None
    return {"name": phase.name, "epochs": phase.epochs, "first_epoch": phase.first_epoch + 1, "steps": phase.steps,
            "peak_learning_rate": phase.learning_rate, "warmup_steps": phase.warmup,
            "trainable_parameters": phases.trainable_parameters(model),
            "batch_norm": "inference" if frozen_statistics else "training", "resumed_from_step": resumed}


def _callbacks(config: TrainSettings, plan: RunPlan, phase, mine: RunDir, profiled, timer: StepTimer,
               resume: ResumePoint, done: int) -> list:
    """Backup, one set of batch-norm statistics, TensorBoard, the learning-rate log and what measures
    the phase; `done`: the steps of the phases before it."""
    from components.train import phases, recipe

    callbacks = [
        phases.backup(config, plan.work, plan.phases, phase),
        resume,
        ReplicaStatistics(),
        keras.callbacks.TensorBoard(mine.tensorboard, profile_batch=profiled),
        timer,
        recipe.LearningRateLog(),
    ]
    if plan.placement.is_chief and plan.work is not plan.run:
        callbacks.insert(callbacks.index(resume), remote_root.Uploads(plan.work, plan.run))
    if config.ema:
        # First, so every later callback (TensorBoard, the history) sees the validation of the average.
        callbacks.insert(0, recipe.EmaEvaluation())
    if os.environ.get(KILL_AT_STEP_ENV):
        callbacks.append(KillAtStep(int(os.environ[KILL_AT_STEP_ENV]) - done))
    return callbacks


def _service_at_end(service: dict | None) -> dict | None:
    """The tf.data service the run used, with the workers it has now (None if it no longer answers)."""
    from components.train import service_input

    if service is None:
        return None
    try:
        return {**service, "workers_at_end": len(service_input.workers(service["address"]))}
    except service_input.ServiceError:
        return {**service, "workers_at_end": None}


def summarize(config: TrainSettings, plan: RunPlan, fitted: Fitted, probe: dict,
              data_service: dict | None = None) -> TrainMetrics:
    """The run's TrainMetrics, as metrics.json holds them."""
    from components.train import run_warnings

    epochs = fitted.history
    first = plan.phases[0]
    placement = plan.placement
    return TrainMetrics.model_validate({
        "run_id": plan.run.run_id,
        "run_dir": plan.run.uri,
        "model_dir": plan.run.candidate,
        "network": config.network,
        "image_size": config.image_size,
        "labels": plan.labels,
        "spans": sorted({s.span for s in plan.train_shards + plan.eval_shards}),
        "strategy": placement.strategy_name,
        "workers": placement.workers,
        "replicas": plan.replicas,
        "precision": placement.precision,
        "xla": placement.xla,
        "batch_size": plan.batch_size,
        "global_batch_size": plan.global_batch,
        "epochs": plan.epochs,
        "steps_per_epoch": plan.steps_per_epoch,
        "total_steps": fitted.total_steps,
        "resumed_from_step": fitted.resumed_from_step,
        "images_per_sec": fitted.images_per_sec,
        "train": {"loss": _last(epochs, "loss"), "accuracy": _last(epochs, "accuracy")},
        "eval": {"loss": _last(epochs, "val_loss"), "accuracy": _last(epochs, "val_accuracy")},
        "history": {key: [float(v) for v in values] for key, values in epochs.items()},
        "exported_weights": "ema" if config.ema else "final",
        "schedule": {"kind": config.schedule, "peak_learning_rate": config.learning_rate,
                     "warmup_steps": first.warmup, "decay_steps": first.steps - first.warmup,
                     "weight_decay": config.weight_decay, "label_smoothing": config.label_smoothing,
                     "ema_momentum": config.ema_momentum if config.ema else None},
        "seed": config.seed,
        "best_epoch": _best_epoch(epochs, first=fitted.resumed_from_step // plan.steps_per_epoch + 1),
        "warnings": run_warnings.warnings(config, plan, epochs),
        "weights": config.weights,
        "weights_file": plan.start,
        "phases": fitted.phases,
        "input": probe,
        "data_service": data_service,
        "gpu": fitted.gpu,
        "profiler": fitted.profiler,
        "staging": plan.staging,
        "dropped_label_errors": len(plan.excluded) if config.drop_suspected_label_errors else None,
        "corrupt": {"skipped_records": sum(s.lost for s in plan.corrupt),
                    "shards": [{"uri": s.uri, "error": s.error, "readable": s.readable,
                                "expected": s.expected} for s in plan.corrupt]},
    })


class ResumePoint(keras.callbacks.Callback):
    """The optimizer step training started from (after BackupAndRestore restored it)."""

    def __init__(self):
        super().__init__()
        self.step = 0

    def on_train_begin(self, logs=None):
        self.step = int(self.model.optimizer.iterations.numpy())


class ReplicaStatistics(keras.callbacks.Callback):
    """Before each validation pass, every replica takes the mean of the replicas' batch-norm moving
    statistics (sync-on-read variables: each replica updates its own copy from its own batches), the
    values the candidate exports; otherwise each replica would score its share of the eval records
    with its own. The updates are linear, so the mean, and the candidate, is the same either way."""

    def on_test_begin(self, logs=None):
        with self.model.distribute_strategy.scope():
            for variable in self.model.non_trainable_variables:
                if variable.synchronization == tf.VariableSynchronization.ON_READ:
                    variable.assign(variable.read_value())


class EpochProgress(keras.callbacks.Callback):
    """A progress event for each finished epoch (counted from the first: a resumed run starts later)."""

    def __init__(self, epochs: int, show: Callable[[Progress], None]):
        super().__init__()
        self.epochs, self.show, self.started = epochs, show, time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        self.show(Progress(stage="train", done=epoch + 1, total=self.epochs, unit="epochs",
                           seconds=round(time.monotonic() - self.started, 1)))


class KillAtStep(keras.callbacks.Callback):
    def __init__(self, step: int):
        super().__init__()
        self.at = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def _profile_range(text: str):
    """Keras' profile_batch: the steps the settings name (checked there), or 0 for none."""
    return trace_range(text) or 0


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
