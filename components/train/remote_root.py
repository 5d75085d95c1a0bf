"""Training on a ROOT TensorFlow cannot open itself (s3://, any fsspec store; components/common/tf_files.py).

Reads: the shards this worker's input pipeline reads are staged into the local shard cache before
TensorFlow starts (components/common/shard_cache.py). Writes: the backup, TensorBoard's logs and the
candidate go to a local run folder in the cache, and are uploaded: the backup each time
BackupAndRestore writes one (its `checkpoint` pointer last, older checkpoints removed after), so a
preempted run resumes from the bucket on any machine; TensorBoard's logs at each epoch's end; the
candidate once, whole, `saved_model.pb` last, so the gate never sees half of it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys

import tf_keras as keras

from components.common.files import exists, remove
from components.common.repository import SAVED_MODEL
from components.common.shard_cache import ShardCache, shards_of_worker
from components.common.shard_digests import Mismatch
from components.common.tf_files import pull, push, tf_reads
from components.contracts.layout import RunDir, Shard
from components.contracts.run_config import TrainSettings

CHECKPOINT_POINTER = "checkpoint"  # tf.train.CheckpointManager's index of the newest checkpoint


def is_remote(run: RunDir) -> bool:
    return not tf_reads(run.uri)


def shards_read(train: list[Shard], eval_: list[Shard], workers: int, pipeline: int) -> list[Shard]:
    """The train and eval shards this worker's input pipelines read (components/common/shard_cache.py)."""
    from components.train.eval_batches import by_file

    mine = shards_of_worker(train, workers, pipeline, by_file(len(train), workers))
    mine += shards_of_worker(eval_, workers, pipeline, by_file(len(eval_), workers)) if eval_ else []
    if train[0] not in mine:
        mine.insert(0, train[0])  # the input probe samples the first training shard on every worker
    return mine


def stage(config: TrainSettings, train: list[Shard], eval_: list[Shard], workers: int,
          pipeline: int) -> tuple[list[Shard], list[Shard], dict, list[Mismatch]]:
    """The local copies of the train and eval shards, what staging did, and the shards of this worker whose
    copy is not the file their manifest names. Raises CacheError when the cache cannot hold them."""
    cache = ShardCache(config.shard_cache.dir, config.shard_cache.max_gb)
    mine = shards_read(train, eval_, workers, pipeline)
    staged = cache.stage(mine)
    report = staged.to_json()
    report["selection"] = ("all shards" if len(mine) == len(train) + len(eval_) else
                           f"this worker's {len(mine)} of {len(train) + len(eval_)} shards (its input pipeline "
                           f"reads every {workers}th file, from the {pipeline}th)")
    print(f"stoke train: staged {report['shards']} shards into {cache.folder}: {staged.fetched} copied "
          f"({report['mb_fetched']} MB in {report['seconds']} s), {staged.reused} reused"
          + (f", {len(staged.refetched)} copied again after failing their check" if staged.refetched else ""),
          file=sys.stderr, flush=True)
    return cache.local(train), cache.local(eval_), report, staged.mismatched


def work_dir(config: TrainSettings, run: RunDir) -> RunDir:
    """Where TensorFlow writes the run: the run folder itself, or a local one in the cache folder."""
    if not is_remote(run):
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
