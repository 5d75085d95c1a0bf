"""`python -m components.train --root ROOT ...`: published spans to a candidate SavedModel.

The run, top to bottom: `train(config)` settles a plan (where it trains, on which records, in how
many steps), builds the model and the datasets, fits it phase by phase (recipe.py), exports the
candidate (models.py), measures itself (measure.py) and writes its summary, metrics.json, last.

One process per worker, the same program everywhere: the strategy comes from TF_CONFIG and the
devices (placement.py), the input from data.py. Artifacts go to ROOT/runs/<run-id>/: backup
(BackupAndRestore: rerunning the same run id resumes at the last backed-up step, when it starts as the
backup did: keep_backup), tensorboard,
candidate, metrics.json, curves.png. Only the chief writes them; other workers write their copies to
temporary folders and delete them, which is how tf.distribute expects multi-worker saving to go. On a
ROOT TensorFlow cannot write (s3://), the run is written into a local folder and uploaded as it goes.

Everything the plan can refuse it refuses before the first step, with a message for the user: a run
that cannot finish should not start.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable

import tensorflow as tf
import tf_keras as keras

from components.common import advice, environment, networks, plots, program, shard_digests
from components.common.files import check_writable, exists, read_result, remove, write_json
from components.common.local_copies import UnsafeKey
from components.common.program import setting_hint
from components.common.repository import SAVED_MODEL
from components.common.runtime_logs import quiet_tensorflow_python
from components.common.shard_cache import CacheError, ShardCache
from components.common.shard_scan import scan_shards
from components.common.span_labels import label_set
from components.common.spans import SpanNotChecked, Spans
from components.common.store_errors import on_root
from components.common.tf_files import pull, push, tf_reads
from components.contracts.config import DEFAULT_BATCH, MIN_STEPS_PER_EPOCH, SMALL_BATCH, TrainConfig, trace_range
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root, RunDir, Shard, new_run_id, parse_spans
from components.contracts.results import BackupStart, ResultError, TrainMetrics
from components.contracts.run_config import RunConfig, RunFacts
from components.contracts.summaries import Progress
from components.train import TrainError, data, measure, recipe, warm
from components.train.models import export_candidate, initial_weights
from components.train.placement import Placement, place
from components.train.recipe import Phase

# Fault drill: with this set to N, the process kills itself (SIGKILL, no cleanup) once N training
# steps are done, so resume from backup can be tested the way a preempted machine fails.
KILL_AT_STEP_ENV = "STOKE_KILL_AT_STEP"
# Keras' own progress: a bar per epoch on a terminal, else a line per epoch, as a log keeps them.
KERAS_VERBOSE = 1 if sys.stdout.isatty() else 2
CHECKPOINT_POINTER = "checkpoint"  # tf.train.CheckpointManager's index of the newest checkpoint


# ---------------------------------------------------------------- the program

def run(argv: list[str] | None = None) -> int:
    args = program.stage_arguments("train", argv)
    quiet_tensorflow_python()  # Keras' "callback is slow" notices on small batches, TensorFlow's deprecations
    # Progress events with --json only: for people, Keras prints "Epoch N/M" itself.
    progress = program.progress_printer(as_json=True) if args.json else None

    def work(config: RunConfig, facts: RunFacts) -> TrainMetrics:
        return train(config, run_id=facts.run_id, progress=progress)

    return program.main("stoke train", args.json, on_root(work, lambda: program.stage_config("train", args)),
                        _describe, errors=(TrainError, ResultError, UnsafeKey, OSError))


def _describe(summary: dict) -> str:
    return (f"trained {summary['network']} for {summary['total_steps']} steps: "
            f"eval accuracy {summary['eval'].get('accuracy')}, candidate {summary['model_dir']}"
            + "".join(f"\nwarning: {warning}" for warning in summary.get("warnings") or []))


# ---------------------------------------------------------------- the run

def train(config: RunConfig, *, run_id: str | None = None,
          progress: Callable[[Progress], None] | None = None) -> TrainMetrics:
    """Trains per `config` (resolved: its preset filled) and returns the summary, which the chief also
    writes to metrics.json; the chief hands `progress` an event at the end of each epoch."""
    plan = make_plan(config, run_id)
    chief = plan.placement.is_chief
    if chief:  # once the plan holds: a refusal stays one line
        print(f"stoke train: {'warm start' if plan.start.warm else 'full retrain'}: {plan.start.reason}",
              file=sys.stderr, flush=True)
        # Before the model is built: the other workers build it with the chief, and restore the backup after.
        keep_backup(plan)
    # Other workers write their copies into a scratch folder of the same layout, deleted at the end.
    mine = plan.work if chief else RunDir(tempfile.mkdtemp(prefix="stoke-worker-"))
    try:
        model, train_data, eval_data = build(config.train, plan)
        # The phases follow the network's backbone, which its function returns with the model.
        plan = dataclasses.replace(plan, phases=recipe.plan_phases(
            config.train, plan.epochs, plan.steps_per_epoch, warm=plan.start.warm,
            has_backbone=networks.backbone(model) is not None))
        resume_from(plan.run, plan.work)
        fitted = fit(config.train, plan, model, train_data, eval_data, mine, progress if chief else None)
        same_inputs(plan)  # the candidate is exported only from the files checked (a resumed run may fit no epoch)
        # fit() ends by copying the average into the model's trainable weights (tf_keras'
        # finalize_variable_values), so with EMA these are the averaged weights.
        export_candidate(network=config.train.network, weights=model.get_weights(), labels=plan.labels,
                         untrained=plan.untrained, image_size=config.train.image_size, path=mine.candidate)
        probe = {}
        if config.train.input_probe_steps:
            probe = measure.input_probe(model, plan.placement.strategy, plan.train_shards, config.train,
                                        plan.global_batch, plan.placement.workers,
                                        real_step_seconds=fitted.step_seconds,
                                        steps=fitted.total_steps - fitted.resumed_from_step)
        metrics = summarize(config.train, plan, fitted, probe, data.service_at_end(plan.data_service))
        if chief:
            networks.keep(plan.network, plan.run)  # the user's code it trained with, beside its record
            upload_candidate(plan.work, plan.run)
            _plot_curves(fitted.history, plan.run.curves)
            write_json(plan.run.metrics, metrics.to_json())  # last: its presence marks the run finished
    finally:
        # A worker's scratch copy, and the local folder of a ROOT in a bucket once all of it is uploaded.
        for folder in {mine.uri, plan.work.uri} - {plan.run.uri}:
            shutil.rmtree(folder, ignore_errors=True)
    return metrics


# ---------------------------------------------------------------- the plan

@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a run settles before building anything, derived once from its settings: where, on which
    records, in how many steps. The settings themselves are read from the run configuration."""
    placement: Placement
    run: RunDir
    work: RunDir  # where TensorFlow writes the run: `run`, or a local folder uploaded to it (work_dir)
    labels: list[str]
    train_shards: list[Shard]
    eval_shards: list[Shard]
    corrupt: list  # ShardScans of the shards train.skip_corrupt reads around
    batch_size: int  # per replica: train.batch_size, or the default for this many records
    global_batch: int
    steps_per_epoch: int
    validation_steps: int  # whole batches, every eval record once (data.py: evaluation's batches)
    eval_records: int
    train_records: int
    epochs: int  # train.epochs, or the fewest that make train.min_steps
    network: networks.Code  # what train.network names: its code, loaded, and the SHA-256 of that code
    staging: dict | None  # the shard cache's report, when ROOT is read through local copies
    start: warm.Start  # from the served model's weights (warm) or afresh (full), and why
    new_records: int  # train records of the spans new to the served model (a full run: all of them)
    replay_records: int = 0  # history records a warm run replays
    data_service: dict | None = None  # the tf.data service training reads from: address, mode, workers
    # the weights the network is built from (models.initial_weights; None: scratch); a warm run restores the
    # served version's over them
    weights_file: str | None = None
    # (span, image/source) of train records left out: suspected label errors, the history a warm run does not replay
    excluded: tuple[tuple[int, str], ...] = ()
    label_errors: int = 0  # of them, the suspected label errors
    watched: shard_digests.Watched | None = None  # the files this worker reads, as they were checked
    # one from scratch, head then fine_tune from a pretrained backbone: set once the network is built
    phases: list[Phase] = dataclasses.field(default_factory=list)
    untrained: list[str] = dataclasses.field(default_factory=list)  # classes of `labels` no record carries

    @property
    def total(self) -> int:
        return self.epochs * self.steps_per_epoch


def make_plan(config: RunConfig, run_id: str | None) -> RunPlan:
    """The plan of the run `config` asks for, or a TrainError saying why it cannot run."""
    settings = config.train
    placement = place(settings, run_id)
    service = connect_service(settings)
    run, train_shards, eval_shards, labels = find_data(config, run_id)
    network = load_network(settings.network)
    start = warm.decide(config, labels, {s.span: s.manifest_sha256 for s in train_shards})
    # Before staging a shard or building a dataset: a run that cannot have its weights stops in seconds. A warm run
    # builds the network as a full one would (a backbone from weights runs its batch norm as it did), then
    # restores the served version's weights over them.
    weights_file = initial_weights(settings.weights, settings.network)
    try:
        train_shards, eval_shards, staging, watched = as_published(config, train_shards, eval_shards, placement)
        work = work_dir(config, run)
    except CacheError as exc:
        raise TrainError(str(exc)) from None
    corrupt, train_records, eval_counts = readable_records(settings, train_shards, eval_shards)
    label_errors = suspected_label_errors(config, train_shards)
    train_records -= len(label_errors)
    all_records, new_records, replay, excluded = train_records, train_records, None, label_errors
    if start.warm:
        left_out = set(label_errors)
        history = [(label, span, source) for label, span, source in warm.labelled_sources(
            [s for s in train_shards if s.span in start.replay_spans], settings.skip_corrupt)
            if (span, source) not in left_out]
        new_records = train_records - len(history)
        replay = warm.replay_sample(history, new_records, settings.replay,
                                    key=f"{settings.seed or 0}:{max(start.new_spans)}")
        excluded += replay.left_out
        train_records = new_records + replay.records
    batch_size = settings.batch_size or default_batch(train_records, placement.replicas)
    global_batch = batch_size * placement.replicas
    steps_per_epoch = train_records // global_batch
    if steps_per_epoch == 0:
        fits = 2 ** max(0, (train_records // placement.replicas).bit_length() - 1)  # the largest power of two that does
        raise TrainError(f"{train_records} training records make no full batch of {global_batch} "
                         f"({batch_size} x {placement.replicas} replicas); lower the batch size, e.g. "
                         f"{setting_hint('train', {'train.batch_size': fits})}")
    if settings.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, settings.steps_per_epoch)
    # A warm run makes the epochs a full one would (train.min_steps counts a full run's steps), over the
    # new records and the replay sample alone: its steps follow the new data, not the total.
    epochs = run_epochs(settings, max(1, all_records // global_batch) if start.warm else steps_per_epoch)
    return RunPlan(
        placement=placement, run=run, work=work, labels=labels.labels, untrained=labels.untrained,
        train_shards=train_shards, eval_shards=eval_shards,
        corrupt=corrupt, batch_size=batch_size, global_batch=global_batch, steps_per_epoch=steps_per_epoch,
        validation_steps=data.eval_steps(eval_counts, placement.workers, global_batch),
        eval_records=sum(eval_counts), train_records=train_records, epochs=epochs, network=network, staging=staging,
        start=start, new_records=new_records, replay_records=replay.records if replay else 0, data_service=service,
        weights_file=weights_file, excluded=excluded, label_errors=len(label_errors), watched=watched)


def load_network(reference: str):
    """The code of the network the run trains, loaded: a module that does not import, or a file that does not
    run, stops the run in one line before any shard is read."""
    try:
        return networks.load(reference)
    except networks.NetworkError as exc:
        raise TrainError(str(exc)) from None


def run_epochs(settings: TrainConfig, steps_per_epoch: int) -> int:
    """train.epochs, or else the fewest whole epochs that make train.min_steps optimizer steps."""
    if settings.epochs:
        return settings.epochs
    if not settings.min_steps:
        raise TrainError("train.epochs and train.min_steps are both unset: set one (a preset sets one of them)")
    return -(-settings.min_steps // steps_per_epoch)


def default_batch(train_records: int, replicas: int) -> int:
    """DEFAULT_BATCH, halved while an epoch would have fewer than MIN_STEPS_PER_EPOCH steps (not
    below SMALL_BATCH): batch-norm statistics and the schedule need steps more than big batches."""
    batch = DEFAULT_BATCH
    while batch > SMALL_BATCH and train_records // (batch * replicas) < MIN_STEPS_PER_EPOCH:
        batch //= 2
    return batch


def connect_service(settings: TrainConfig) -> dict | None:
    """The tf.data service the input runs on, once its dispatcher answers and has a worker."""
    if settings.data_service is None:
        return None
    try:
        return data.connect(settings.data_service)
    except data.ServiceError as exc:
        raise TrainError(str(exc)) from None


def find_data(config: RunConfig, run_id: str | None) -> tuple[RunDir, list[Shard], list[Shard], LabelSet]:
    """The run folder, the train and eval shards of the spans asked for, and the label set their records make."""
    root = Root(config.root)
    stored_spans = Spans(root)
    try:
        spans = parse_spans(config.train.spans)
        run = root.run(run_id or new_run_id())
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    try:
        train_shards = stored_spans.shards("train", spans)
        eval_shards = stored_spans.shards("eval", spans)
    except SpanNotChecked as exc:
        raise TrainError(str(exc)) from None
    # Spans without a valid record (never checked, or their manifest changed since) are left out, and said so.
    unchecked = [read.refusal(root.uri) for n in stored_spans.published() if (spans is None or n in spans)
                 and (read := stored_spans.check_record(n)).record is None]
    if not train_shards:
        raise TrainError(f"no published span the data check let in with training records under {root.spans}"
                         + (f" among spans {config.train.spans}" if spans else "")
                         + (f"; {'; '.join(unchecked[:3])}" if unchecked else "; run `stoke ingest` first"))
    for why in unchecked:
        print(f"stoke train: warning: left out: {why}", file=sys.stderr, flush=True)
    labels = label_set(root, spans)
    stored = min((m.max_side for m in stored_spans.manifests(spans) if m.max_side), default=None)
    if stored and config.train.image_size > stored:
        larger = setting_hint("ingest", {"ingest.max_side": max(512, 2 * config.train.image_size)})
        print(f"stoke train: warning: train.image_size {config.train.image_size} is larger than the spans hold "
              f"(ingested with ingest.max_side {stored}), so images are upsampled; for sharper inputs, ingest the "
              f"source into a new ROOT with {larger}", file=sys.stderr, flush=True)
    if exists(run.metrics):
        raise TrainError(f"run {run.run_id} already finished ({run.metrics}); choose a new run id")
    check_writable(run.uri)  # a read-only or full ROOT fails here, not after training
    return run, train_shards, eval_shards, labels


def as_published(config: RunConfig, train_shards: list[Shard], eval_shards: list[Shard], placement: Placement
                 ) -> tuple[list[Shard], list[Shard], dict | None, shard_digests.Watched]:
    """The train and eval shards where TensorFlow reads them, once those this worker reads are the files their
    manifests name: checked in place (components/common/shard_digests.py), or staged into the shard cache, which
    checks its copies; the staging's report (None: read in place); and those files by identity, which the run
    looks at again as it goes (same_inputs). A shard changed since it was published stops the run; a damaged
    one too, unless train.skip_corrupt reads around it."""
    checked = None
    mine = data.shards_read(train_shards, eval_shards, placement.workers, placement.pipeline)
    if tf_reads(train_shards[0].uri):
        watched = shard_digests.Watched(mine)  # before the check: a change after it shows at the next look
        checked = shard_digests.check(mine, config.shard_cache.dir)
        staging, mismatched = None, checked.mismatched
    else:
        cache = ShardCache(config.shard_cache.dir, config.shard_cache.max_gb)
        train_shards, eval_shards, staging, mismatched = data.stage(cache, train_shards, eval_shards,
                                                                    placement.workers, placement.pipeline)
        watched = shard_digests.Watched(mine, cache.local(mine))  # the copies, which TensorFlow reads
    changed = [m for m in mismatched if not m.damaged]
    if changed:
        raise TrainError(shard_digests.changed_spans(changed))
    damaged = [m for m in mismatched if m.damaged]
    if damaged and not config.train.skip_corrupt:
        raise TrainError(f"corrupt shard: {'; '.join(map(str, damaged))}; rerun with "
                         f"{setting_hint('train', {'train.skip_corrupt': True})} to skip its unreadable records")
    if checked and (checked.hashed or checked.unrecorded):
        print(f"stoke train: {checked.describe()}", file=sys.stderr, flush=True)
    return train_shards, eval_shards, staging, watched


def suspected_label_errors(config: RunConfig, train_shards: list[Shard]) -> tuple[tuple[int, str], ...]:
    """With train.drop_suspected_label_errors, the train records the data check's label check flagged in
    the spans read ((span, source URI), from each span's record); otherwise none."""
    if not config.train.drop_suspected_label_errors:
        return ()
    stored_spans = Spans(config.root)
    found = sorted({(span, a.file) for span in sorted({s.span for s in train_shards})
                    for a in stored_spans.check_record(span).record.suspected_label_errors() if a.label.split == "train"})
    if found:
        print(f"stoke train: leaving out {len(found)} training records the data check flagged as suspected label "
              "errors (train.drop_suspected_label_errors)", file=sys.stderr, flush=True)
    return tuple(found)


def readable_records(settings: TrainConfig, train_shards: list[Shard],
                     eval_shards: list[Shard]) -> tuple[list, int, list[int]]:
    """The corrupt shards, the train records and each eval shard's records to count on: with
    train.skip_corrupt, what is readable now (one pass over the split); otherwise what the manifests promise."""
    if not settings.skip_corrupt:
        return [], sum(s.records for s in train_shards), [s.records for s in eval_shards]
    scans = scan_shards(train_shards + eval_shards)
    return ([s for s in scans if s.error], sum(s.readable for s in scans[:len(train_shards)]),
            [s.readable for s in scans[len(train_shards):]])


# ---------------------------------------------------------------- the model and its datasets

def build(settings: TrainConfig, plan: RunPlan):
    """The model, from the plan's weights file or from scratch, and the distributed train and eval datasets
    (None without eval records); each phase compiles the model itself (recipe.prepare)."""
    strategy = plan.placement.strategy
    train_data = strategy.distribute_datasets_from_function(dataset_fn(settings, plan, plan.train_shards, True))
    eval_data = (strategy.distribute_datasets_from_function(dataset_fn(settings, plan, plan.eval_shards, False))
                 if plan.validation_steps else None)
    with strategy.scope():
        try:
            model = networks.build(plan.network, len(plan.labels), settings.image_size, plan.weights_file)
        except ValueError as exc:  # a NetworkError, or weights that do not fit
            raise TrainError(str(exc)) from None
        if plan.start.warm:  # a backup, when there is one, restores over these as fit() begins
            warm.restore(model, plan.start)
    return model, train_data, eval_data


def dataset_fn(settings: TrainConfig, plan: RunPlan, shards: list[Shard], training: bool):
    """The per-input-pipeline dataset function tf.distribute calls once per worker; evaluation's
    batches hold every eval record once, weighted, then blanks (data.py: evaluation's batches)."""
    service = plan.data_service if training else None

    def make(context: tf.distribute.InputContext):
        # Each replica of this worker takes one batch per step.
        replicas = context.num_replicas_in_sync // context.num_input_pipelines
        options = data.PipelineOptions(
            batch_size=context.get_per_replica_batch_size(plan.global_batch), training=training,
            cache=settings.image_cache,
            seed=None if settings.seed is None else settings.seed + context.input_pipeline_id,
            eval_batches=None if training else plan.validation_steps * replicas,
            eval_weight=1.0 if training else data.record_weight(plan.eval_records, plan.validation_steps,
                                                                plan.global_batch),
            exclude=plan.excluded if training else ())
        if options.cache not in (None, "memory"):
            split = "train" if training else "eval"
            options = dataclasses.replace(options, cache=data.claim_cache(
                options.cache, split, data.cache_key(shards, settings, options, context)))
        if service:
            # The workers run the whole pipeline, unsharded (the dispatcher shares the files out), up to the
            # batch; trainers of one multi-worker run share one job of the service: one dataset, one seed.
            job = f"stoke-{plan.run.run_id}" if plan.placement.workers > 1 else None
            dataset = data.make_dataset(shards, settings, dataclasses.replace(options, seed=settings.seed))
            return data.through_service(dataset, service["address"], job)
        return data.make_dataset(shards, settings, options, context)
    return make


# ---------------------------------------------------------------- fit, backup and resume

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


def fit(settings: TrainConfig, plan: RunPlan, model, train_data, eval_data, mine: RunDir,
        progress: Callable[[Progress], None] | None = None) -> Fitted:
    """Runs model.fit() once per phase (recipe.py) with the run's callbacks; a bad CRC becomes a TrainError
    naming the shard."""
    profiled = trace_range(settings.trace_steps) or 0  # Keras' profile_batch: the steps asked for, or none
    shown = EpochProgress(plan.epochs, progress) if progress else None
    history, done, resumed, records = {}, 0, 0, []
    try:
        with measure.GpuSampler() as sampler:  # each worker samples its own GPUs; nothing without NVML
            for phase in plan.phases:
                last = phase is plan.phases[-1]
                recipe.prepare(model, phase, settings, len(plan.labels), plan.placement.xla)
                timer, resume = measure.StepTimer(skip=profiled if last else 0), ResumePoint()
                callbacks = _callbacks(settings, plan, phase, mine, profiled if last else 0, timer, resume, done)
                logs = model.fit(train_data, initial_epoch=phase.first_epoch, epochs=phase.end_epoch,
                                 steps_per_epoch=plan.steps_per_epoch, validation_data=eval_data,
                                 validation_steps=plan.validation_steps or None,
                                 callbacks=callbacks + ([shown] if shown else []), verbose=KERAS_VERBOSE)
                history = recipe.merged(history, logs.history)
                done, resumed = done + int(model.optimizer.iterations.numpy()), resumed + resume.step
                records.append(_phase_record(model, phase, resume.step))
    except tf.errors.DataLossError:
        bad = [s for s in scan_shards(plan.train_shards + plan.eval_shards) if s.error]
        if not bad:
            raise
        raise TrainError(str(data.CorruptShardError(bad))) from None
    except InputsChanged:
        if plan.placement.is_chief:  # what it learnt from the changed file is in the backup too
            drop_backups(plan.work, plan.run)
        raise
    if plan.placement.is_chief:
        drop_backups(plan.work, plan.run)
    return Fitted(history=history, total_steps=done, resumed_from_step=resumed, step_seconds=timer.step_seconds(),
                  images_per_sec=timer.images_per_sec(plan.global_batch), gpu=sampler.to_dict(),
                  profiler=measure.input_pipeline_verdict(mine.tensorboard) if profiled else None, phases=records)


def _phase_record(model, phase: Phase, resumed: int) -> dict:
    """The phase as metrics.json records it (results.TrainPhase)."""
    frozen_statistics = phase.name != "all" and networks.backbone(model) is not None
    return {"name": phase.name, "epochs": phase.epochs, "first_epoch": phase.first_epoch + 1, "steps": phase.steps,
            "peak_learning_rate": phase.learning_rate, "warmup_steps": phase.warmup,
            "trainable_parameters": recipe.trainable_parameters(model),
            "batch_norm": "inference" if frozen_statistics else "training", "resumed_from_step": resumed}


def _callbacks(settings: TrainConfig, plan: RunPlan, phase: Phase, mine: RunDir, profiled, timer: measure.StepTimer,
               resume: ResumePoint, done: int) -> list:
    """Backup, one set of batch-norm statistics, TensorBoard, the learning-rate log and what measures
    the phase; `done`: the steps of the phases before it."""
    callbacks = [
        SameInputs(plan),  # first: a changed input stops the run before the epoch's backup
        backup(settings, plan.work, plan.phases, phase),
        resume,
        ReplicaStatistics(),
        keras.callbacks.TensorBoard(mine.tensorboard, profile_batch=profiled),
        timer,
        recipe.LearningRateLog(),
    ]
    if plan.placement.is_chief and plan.work is not plan.run:
        callbacks.insert(callbacks.index(resume), Uploads(plan.work, plan.run))
    if settings.ema:
        # First, so every later callback (TensorBoard, the history) sees the validation of the average.
        callbacks.insert(0, recipe.EmaEvaluation())
    if os.environ.get(KILL_AT_STEP_ENV):
        callbacks.append(KillAtStep(int(os.environ[KILL_AT_STEP_ENV]) - done))
    return callbacks


# Each phase backs up into a folder of its own (RunDir.phase_backup), a run of one phase into `backup`
# itself. The head phase backs up once more as it ends and keeps that backup, so a rerun of a run killed
# while fine-tuning restores the finished head phase (its fit runs no epoch), then the fine-tuning
# phase's own backup, and goes on where it was.

class KeptBackup(keras.callbacks.BackupAndRestore):
    """The backup of a phase before the last: it backs up once more as the phase ends, whatever the save
    frequency, and keeps that backup, so that a rerun restores the phase finished instead of redoing it."""

    def __init__(self, folder: str, save_freq):
        super().__init__(folder, save_freq=save_freq, delete_checkpoint=False)

    def on_train_end(self, logs=None):
        if self.save_freq != "epoch" and self._batches_count:  # steps since the last backup
            self._backup(epoch=self._current_epoch)
        super().on_train_end(logs)


def backup(settings: TrainConfig, work: RunDir, phases: list[Phase], phase: Phase) -> keras.callbacks.Callback:
    """The phase's BackupAndRestore: into `backup` for a run of one phase, else into the phase's own folder."""
    save_freq = settings.backup_every or "epoch"
    if phase is not phases[-1]:
        return KeptBackup(work.phase_backup(phase.name), save_freq)
    folder = work.backup if len(phases) == 1 and phase.name == "all" else work.phase_backup(phase.name)
    return keras.callbacks.BackupAndRestore(folder, save_freq=save_freq)


def drop_backups(work: RunDir, run: RunDir) -> None:
    """Once the last phase is done, the backup folder whole: the backups phases kept, the folder
    BackupAndRestore empties but leaves, and with a ROOT in a bucket the uploaded backup. Not before: a run
    killed while training resumes from it."""
    for folder in {work.backup, run.backup}:
        if exists(folder):
            remove(folder)


def keep_backup(plan: RunPlan) -> None:
    """Keeps the run's backup only when it grew from the start this run makes (warm.resumable): one made under
    another start, or that records none, is dropped, in one line. Then records the start of what the run
    backs up, before its first backup."""
    run = plan.run
    if exists(run.backup):
        try:
            made = read_result(run.backup_start, BackupStart) if exists(run.backup_start) else None
        except ResultError:
            made = None  # a record that does not read records no start
        why = warm.resumable(made, plan.start)
        if why:
            print(f"stoke train: dropped the backup of run {run.run_id}: {why}", file=sys.stderr, flush=True)
            drop_backups(plan.work, run)
    write_json(run.backup_start, warm.backup_start(plan.start).to_json())


class InputsChanged(TrainError):
    """A file the run reads is not the one checked before training; the message names it."""


def same_inputs(plan: RunPlan) -> None:
    """Raises InputsChanged when a file the run reads is not the one checked before training: tf.data opens the
    shards again every epoch, so a shard written or replaced mid-run would be trained on. A stat each."""
    changed = plan.watched.changed() if plan.watched is not None else []
    if changed:
        raise InputsChanged(plan.watched.changed_while_read(changed))


class SameInputs(keras.callbacks.Callback):
    """same_inputs at each epoch's end: the next epoch opens the shards again."""

    def __init__(self, plan: RunPlan):
        super().__init__()
        self.plan = plan

    def on_epoch_end(self, epoch, logs=None):
        same_inputs(self.plan)


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


# ---------------------------------------------------------------- a ROOT TensorFlow cannot write
# On s3:// (any store TensorFlow cannot open itself, components/common/tf_files.py) the backup,
# TensorBoard's logs and the candidate go to a local run folder in the shard cache's folder, and are
# uploaded: the backup each time BackupAndRestore writes one (its `checkpoint` pointer last, older
# checkpoints removed after), so a preempted run resumes from the bucket on any machine; TensorBoard's
# logs at each epoch's end; the candidate once, whole, `saved_model.pb` last, so the gate never sees half
# of it. The local folder goes once all of it is uploaded (or the run fails: the bucket's backup is what
# a rerun resumes from), so the cache's folder keeps no run beside the copies its cap counts.

def work_dir(config: RunConfig, run: RunDir) -> RunDir:
    """Where TensorFlow writes the run: the run folder itself, or a local one in the cache folder."""
    if tf_reads(run.uri):
        return run
    key = hashlib.sha256(run.uri.encode()).hexdigest()[:10]
    return RunDir(ShardCache(config.shard_cache.dir, config.shard_cache.max_gb).run_folder(f"{run.run_id}-{key}"))


def resume_from(run: RunDir, work: RunDir) -> None:
    """Makes the local backup the bucket's: a run resumes from what was uploaded, on any machine.
    Raises UnsafeKey, before anything is written, for a key in the bucket that would land outside it."""
    if work is run:
        return
    if not pull(run.backup, work.backup):
        shutil.rmtree(work.backup, ignore_errors=True)


def upload_candidate(work: RunDir, run: RunDir) -> None:
    """The candidate, whole: an earlier attempt's is removed first, and saved_model.pb comes last."""
    if work is run:
        return
    if exists(run.candidate):
        remove(run.candidate)
    push(work.candidate, run.candidate, last=SAVED_MODEL)
    push(work.tensorboard, run.tensorboard)


class Uploads(keras.callbacks.Callback):
    """Uploads the backup when BackupAndRestore has written a new one, and TensorBoard's logs each epoch."""

    def __init__(self, work: RunDir, run: RunDir):
        super().__init__()
        self.work, self.run, self.seen = work, run, None

    def _backup(self):
        state = _snapshot(self.work.backup)
        if state and state != self.seen:
            push(self.work.backup, self.run.backup, last=CHECKPOINT_POINTER, prune=True)
            self.seen = state

    def on_train_batch_end(self, batch, logs=None):
        self._backup()

    def on_epoch_end(self, epoch, logs=None):
        self._backup()
        if os.path.isdir(self.work.tensorboard):
            push(self.work.tensorboard, self.run.tensorboard)

    def on_train_end(self, logs=None):
        # BackupAndRestore deletes its backup once training ends; the bucket's goes with it.
        if not _snapshot(self.work.backup) and exists(self.run.backup):
            remove(self.run.backup)


def _snapshot(folder: str) -> dict:
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, files in os.walk(folder) for f in files}


# ---------------------------------------------------------------- the summary

# A run from scratch with fewer optimizer steps is flagged as too short: the texture set of docs/train.md's
# Training section converged in 156 steps, the digits in 400; the tests' 12-step runs did not.
MIN_STEPS = 150
# Train accuracy "rose" when its last epoch is this far above its first and above the majority share.
RISE = 0.1


def summarize(settings: TrainConfig, plan: RunPlan, fitted: Fitted, probe: dict,
              data_service: dict | None = None) -> TrainMetrics:
    """The run's TrainMetrics, as metrics.json holds them."""
    epochs = fitted.history
    first = plan.phases[0]
    placement = plan.placement
    return TrainMetrics.model_validate({
        "run_id": plan.run.run_id,
        "run_dir": plan.run.uri,
        "model_dir": plan.run.candidate,
        "network": plan.network.identity,
        "network_digest": plan.network.digest,
        "image_size": settings.image_size,
        "labels": plan.labels,
        "untrained": plan.untrained,
        "spans": sorted({s.span for s in plan.train_shards + plan.eval_shards}),
        "span_manifests": {s.span: s.manifest_sha256 for s in plan.train_shards + plan.eval_shards},
        "strategy": placement.strategy_name,
        "workers": placement.workers,
        "replicas": placement.replicas,
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
        "exported_weights": "ema" if settings.ema else "final",
        "schedule": {"kind": settings.schedule, "peak_learning_rate": first.learning_rate,
                     "warmup_steps": first.warmup, "decay_steps": first.steps - first.warmup,
                     "weight_decay": settings.weight_decay, "label_smoothing": settings.label_smoothing,
                     "ema_momentum": settings.ema_momentum if settings.ema else None},
        "seed": settings.seed,
        "best_epoch": _best_epoch(epochs, first=fitted.resumed_from_step // plan.steps_per_epoch + 1),
        "warnings": warnings(settings, plan, epochs),
        "weights": settings.weights,
        "weights_file": None if plan.start.warm else plan.weights_file,
        "start": start_record(plan),
        "environment": environment.record(),
        "phases": fitted.phases,
        "input": probe,
        "data_service": data_service,
        "gpu": fitted.gpu,
        "profiler": fitted.profiler,
        "staging": plan.staging,
        "dropped_label_errors": plan.label_errors if settings.drop_suspected_label_errors else None,
        "corrupt": {"skipped_records": sum(s.lost for s in plan.corrupt),
                    "shards": [{"uri": s.uri, "error": s.error, "readable": s.readable,
                                "expected": s.expected} for s in plan.corrupt]},
    })


def start_record(plan: RunPlan) -> dict:
    """metrics.json's `start` (results.TrainStart): warm or full, from which version, on which records."""
    start = plan.start
    read = sorted({s.span for s in plan.train_shards})
    return {"kind": start.kind, "reason": start.reason, "from_version": start.from_version,
            "new_spans": list(start.new_spans) if start.warm else read, "replay_spans": list(start.replay_spans),
            "new_records": plan.new_records, "replay_records": plan.replay_records,
            "warm_runs_since_full": start.warm_runs_since_full}


def warnings(settings: TrainConfig, plan: RunPlan, history: dict) -> list[str]:
    """What metrics.json warns about: a run from scratch too short to converge, and one that learned
    nothing, whose eval accuracy stayed at the eval split's majority share while train accuracy rose (the
    model memorised the training images: on 150 photos, efficientnet_b0 from scratch scores 1.00 on
    them and the majority's 0.33 on the eval split, epoch after epoch)."""
    found = [] if plan.start.warm else short_run_warnings(plan.total, settings.weights)
    if plan.untrained:
        one = len(plan.untrained) == 1
        found.append(f"no record of the spans trained on carries {', '.join(plan.untrained)}, though one carries a "
                     f"class of a higher id ({'its' if one else 'their'} span is held back by the data check, or ingest "
                     f"refused {'its' if one else 'their'} files): the model keeps {'its id' if one else 'their ids'} "
                     f"and never answers {'it' if one else 'them'}")
    flat = learned_nothing(history, plan.eval_records, lambda: [label for label, _, _ in warm.labelled_sources(
        plan.eval_shards, settings.skip_corrupt)])
    if flat:
        per_class = round(plan.train_records / len(plan.labels)) if plan.labels else None
        majority, count = flat
        found.append(f"eval accuracy stayed at {max(history['val_accuracy']):.2f}, the share of the eval split's most "
                     f"common class ({plan.labels[majority] if majority < len(plan.labels) else majority}: {count} of "
                     f"{plan.eval_records}), while train accuracy rose from {history['accuracy'][0]:.2f} to "
                     f"{history['accuracy'][-1]:.2f}: the model learned the training images, not what tells the "
                     "classes apart. " + advice.in_words(*advice.causes_and_fixes(settings.network, settings.weights,
                                                                                  per_class)))
    return found


def short_run_warnings(total_steps: int, weights: str | None) -> list[str]:
    """A run from scratch of fewer steps than models need to converge."""
    if weights == "none" and total_steps < MIN_STEPS:
        return [f"only {total_steps} training steps: a model trained from scratch rarely converges in fewer "
                f"than {MIN_STEPS}; train more epochs, or on more data"]
    return []


def learned_nothing(history: dict, eval_records: int, labels) -> tuple[int, int] | None:
    """(the majority class, its eval records) when every epoch's eval accuracy is within one record of
    that class's share while train accuracy rose beyond it; else None. `labels()` gives the eval
    split's labels: read only when the eval accuracy is flat enough to be the majority's."""
    val, trained = history.get("val_accuracy") or [], history.get("accuracy") or []
    if len(val) < 2 or len(trained) < 2 or not eval_records:
        return None
    record = 1 / eval_records + 1e-6
    if max(val) - min(val) > 2 * record:  # it moved: whatever it learned, it was not one constant answer
        return None
    counts = collections.Counter(labels())
    if not counts:
        return None
    majority, count = counts.most_common(1)[0]
    share = count / sum(counts.values())
    if any(abs(v - share) > record for v in val):
        return None
    if trained[-1] - trained[0] < RISE or trained[-1] < share + RISE:
        return None
    return majority, count


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
    fig, axes = plots.pyplot().subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("loss", "accuracy")):
        for key, style in ((metric, "-"), (f"val_{metric}", "--")):
            if history.get(key):
                ax.plot(range(1, len(history[key]) + 1), history[key], style, marker="o", label=key)
        ax.set_xlabel("epoch")
        ax.set_title(metric)
        ax.legend()
    plots.save(fig, uri)
