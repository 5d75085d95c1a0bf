"""A training run's plan, settled before TensorFlow builds anything: the strategy and its devices,
the spans and their readable records, the batch and the number of steps.

Everything here that can refuse does so before the first step, with a message for the user: a run
that cannot finish should not start.
"""
from __future__ import annotations

import dataclasses
import sys

import tensorflow as tf
import tf_keras as keras

from components.common import shard_digests
from components.common.files import check_writable, exists
from components.common.program import setting_hint
from components.common.shard_cache import CacheError
from components.common.shard_scan import scan_shards
from components.common.spans import SpanNotChecked, Spans
from components.common.tf_files import tf_reads
from components.contracts.config import DEFAULT_BATCH, MIN_STEPS_PER_EPOCH, SMALL_BATCH
from components.contracts.layout import Root, RunDir, Shard, new_run_id, parse_spans
from components.contracts.run_config import TrainSettings


class TrainError(Exception):
    """A refusal with a message for the user (no traceback)."""


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


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What train() settles before building anything: where, on which records, in how many steps."""
    placement: Placement
    run: RunDir
    work: RunDir  # where TensorFlow writes the run: `run`, or a local folder uploaded to it (remote_root.py)
    labels: list[str]
    train_shards: list[Shard]
    eval_shards: list[Shard]
    corrupt: list  # ShardScans of the shards --skip-corrupt reads around
    batch_size: int
    global_batch: int
    steps_per_epoch: int
    validation_steps: int  # whole batches, every eval record once (components/train/eval_batches.py)
    eval_records: int
    train_records: int
    epochs: int  # train.epochs, or the fewest that make train.min_steps
    total: int
    phases: list  # components/train/phases.py Phase: one from scratch, head then fine_tune from pretrained weights
    staging: dict | None  # the shard cache's report, when ROOT is read through local copies
    data_service: dict | None = None  # the tf.data service training reads from: address, mode, workers
    start: str | None = None  # the weights file the network starts from (components/train/weights.py); None: scratch
    excluded: tuple[str, ...] = ()  # source URIs of train records left out as suspected label errors

    @property
    def replicas(self) -> int:
        return self.placement.strategy.num_replicas_in_sync


def resolve(config: TrainSettings) -> RunPlan:
    """The plan of the run `config` asks for, or a TrainError saying why it cannot run."""
    from components.train import eval_batches, image_cache, phases, remote_root
    from components.train.weights import initial_weights

    if image_cache.refusal(config.image_cache):
        raise TrainError(image_cache.refusal(config.image_cache))
    placement = place(config)
    service = data_service(config)
    run, train_shards, eval_shards, labels = find_data(config)
    # Before staging a shard or building a dataset: a run that cannot have its weights stops in seconds.
    start = initial_weights(config.weights, config.network)
    try:
        train_shards, eval_shards, staging = as_published(config, train_shards, eval_shards, placement)
        work = remote_root.work_dir(config, run)
    except CacheError as exc:
        raise TrainError(str(exc)) from None
    corrupt, train_records, eval_counts = readable_records(config, train_shards, eval_shards)
    excluded = suspected_label_errors(config, train_shards)
    train_records -= len(excluded)
    replicas = placement.strategy.num_replicas_in_sync
    batch_size = config.batch_size or default_batch(train_records, replicas)
    global_batch = batch_size * replicas
    steps_per_epoch = train_records // global_batch
    if steps_per_epoch == 0:
        fits = 2 ** max(0, (train_records // replicas).bit_length() - 1)  # the largest power of two that does
        raise TrainError(f"{train_records} training records make no full batch of {global_batch} "
                         f"({batch_size} x {replicas} replicas); lower the batch size, e.g. "
                         f"{setting_hint('train', {'train.batch_size': fits})}")
    if config.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, config.steps_per_epoch)
    epochs = run_epochs(config, steps_per_epoch)
    return RunPlan(
        placement=placement, run=run, work=work, labels=labels,
        train_shards=train_shards, eval_shards=eval_shards,
        corrupt=corrupt, batch_size=batch_size, global_batch=global_batch, steps_per_epoch=steps_per_epoch,
        validation_steps=eval_batches.steps(eval_counts, placement.workers, global_batch),
        eval_records=sum(eval_counts), train_records=train_records, epochs=epochs, total=epochs * steps_per_epoch,
        data_service=service, staging=staging, excluded=excluded, start=start,
        phases=phases.plan_phases(config, epochs, steps_per_epoch))


def run_epochs(config: TrainSettings, steps_per_epoch: int) -> int:
    """train.epochs, or else the fewest whole epochs that make train.min_steps optimizer steps."""
    if config.epochs:
        return config.epochs
    if not config.min_steps:
        raise TrainError("train.epochs and train.min_steps are both unset: set one (a preset sets one of them)")
    return -(-config.min_steps // steps_per_epoch)


def place(config: TrainSettings) -> Placement:
    """Sets up the devices, the strategy and the global Keras policy (precision, seed)."""
    from components.train import strategy as strategies

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
    placement = Placement(
        strategy=strategy, strategy_name=strategy_name,
        workers=cluster.workers if strategy_name == "multi_worker" else 1,
        pipeline=cluster.pipeline if strategy_name == "multi_worker" else 0,
        is_chief=strategy_name != "multi_worker" or cluster.is_chief,
        precision=strategies.choose_precision(config.precision, strategies.compute_capabilities(gpus)),
        xla=strategies.choose_xla(config.xla, len(gpus)))
    keras.mixed_precision.set_global_policy(placement.precision)
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)  # Python, NumPy and TensorFlow: initialisation, dropout
    return placement


def data_service(config: TrainSettings) -> dict | None:
    """The tf.data service the input runs on, once its dispatcher answers and has a worker."""
    from components.train import service_input

    if config.data_service is None:
        return None
    if config.image_cache:
        raise TrainError("train.image_cache and train.data_service do not go together: a worker's files change from pass to "
                         "pass, so its cache would hold part of the split")
    try:
        return service_input.connect(config.data_service)
    except service_input.ServiceError as exc:
        raise TrainError(str(exc)) from None


def find_data(config: TrainSettings) -> tuple[RunDir, list[Shard], list[Shard], list[str]]:
    """The run folder, the train and eval shards of the spans asked for, and their label names."""
    root = Root(config.root)
    try:
        spans = parse_spans(config.spans)
        run = root.run(config.run_id or new_run_id())
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    try:
        train_shards = Spans(root).shards("train", spans)
        eval_shards = Spans(root).shards("eval", spans)
    except SpanNotChecked as exc:
        raise TrainError(str(exc)) from None
    # Spans without a valid record (never checked, or their manifest changed since) are left out, and said so.
    unchecked = [read.refusal(root.uri) for n in Spans(root).published() if (spans is None or n in spans)
                 and (read := Spans(root).check_record(n)).record is None]
    if not train_shards:
        raise TrainError(f"no published span the data check let in with training records under {root.spans}"
                         + (f" among spans {config.spans}" if spans else "")
                         + (f"; {'; '.join(unchecked[:3])}" if unchecked else "; run `stoke ingest` first"))
    for why in unchecked:
        print(f"stoke train: warning: left out: {why}", file=sys.stderr, flush=True)
    labels = Spans(root).label_names(spans)
    stored = min((m.max_side for m in Spans(root).manifests(spans) if m.max_side), default=None)
    if stored and config.image_size > stored:
        larger = setting_hint("ingest", {"ingest.max_side": max(512, 2 * config.image_size)})
        print(f"stoke train: warning: train.image_size {config.image_size} is larger than the spans hold (ingested "
              f"with ingest.max_side {stored}), so images are upsampled; for sharper inputs, ingest the source into "
              f"a new ROOT with {larger}", file=sys.stderr, flush=True)
    if exists(run.metrics):
        raise TrainError(f"run {run.run_id} already finished ({run.metrics}); choose a new --run-id")
    check_writable(run.uri)  # a read-only or full ROOT fails here, not after training
    return run, train_shards, eval_shards, labels


def as_published(config: TrainSettings, train_shards: list[Shard], eval_shards: list[Shard],
                 placement: Placement) -> tuple[list[Shard], list[Shard], dict | None]:
    """The train and eval shards where TensorFlow reads them, once those this worker reads are the files their
    manifests name: checked in place (components/common/shard_digests.py), or staged into the shard cache, which
    checks its copies; and the staging's report (None: read in place). A shard changed since it was published
    stops the run; a damaged one too, unless --skip-corrupt reads around it."""
    from components.train import remote_root

    checked = None
    if tf_reads(train_shards[0].uri):
        checked = shard_digests.check(remote_root.shards_read(train_shards, eval_shards, placement.workers,
                                                              placement.pipeline), config.shard_cache.dir)
        staging, mismatched = None, checked.mismatched
    else:
        train_shards, eval_shards, staging, mismatched = remote_root.stage(
            config, train_shards, eval_shards, placement.workers, placement.pipeline)
    changed = [m for m in mismatched if not m.damaged]
    if changed:
        raise TrainError(shard_digests.changed_spans(changed))
    damaged = [m for m in mismatched if m.damaged]
    if damaged and not config.skip_corrupt:
        raise TrainError(f"corrupt shard: {'; '.join(map(str, damaged))}; rerun with "
                         f"{setting_hint('train', {'train.skip_corrupt': True})} to skip its unreadable records")
    if checked and (checked.hashed or checked.unrecorded):
        print(f"stoke train: {checked.describe()}", file=sys.stderr, flush=True)
    return train_shards, eval_shards, staging


def suspected_label_errors(config: TrainSettings, train_shards: list[Shard]) -> tuple[str, ...]:
    """With train.drop_suspected_label_errors, the train records the data check's label check flagged in
    the spans read (their source URIs, from each span's record); otherwise none."""
    if not config.drop_suspected_label_errors:
        return ()
    root = Root(config.root)
    found = sorted({a.file for span in sorted({s.span for s in train_shards})
                    for a in Spans(root).check_record(span).record.suspected_label_errors() if a.label.split == "train"})
    if found:
        print(f"stoke train: leaving out {len(found)} training records the data check flagged as suspected label "
              "errors (train.drop_suspected_label_errors)", file=sys.stderr, flush=True)
    return tuple(found)


def readable_records(config: TrainSettings, train_shards: list[Shard],
                     eval_shards: list[Shard]) -> tuple[list, int, list[int]]:
    """The corrupt shards, the train records and each eval shard's records to count on: with
    --skip-corrupt, what is readable now (one pass over the split); otherwise what the manifests promise."""

    if not config.skip_corrupt:
        return [], sum(s.records for s in train_shards), [s.records for s in eval_shards]
    scans = scan_shards(train_shards + eval_shards)
    return ([s for s in scans if s.error], sum(s.readable for s in scans[:len(train_shards)]),
            [s.readable for s in scans[len(train_shards):]])


def default_batch(train_records: int, replicas: int) -> int:
    """DEFAULT_BATCH, halved while an epoch would have fewer than MIN_STEPS_PER_EPOCH steps (not
    below SMALL_BATCH): batch-norm statistics and the schedule need steps more than big batches."""
    batch = DEFAULT_BATCH
    while batch > SMALL_BATCH and train_records // (batch * replicas) < MIN_STEPS_PER_EPOCH:
        batch //= 2
    return batch
