"""Is the accelerator waiting for input? The step timer measures real training steps; after
training, the probe measures the input pipeline's rate alone against the model's step rate on one
in-memory batch, and how long the real steps waited.
"""
from __future__ import annotations

import time

import tensorflow as tf
import tf_keras as keras

from components.contracts.run_config import TrainSettings


def input_probe(model, strategy, shards, config: TrainSettings, global_batch: int, workers: int,
                *, real_step_seconds: float | None, steps: int) -> dict:
    """Input rate alone vs. the model's rate on one in-memory batch, and the time steps waited.

    Runs after the candidate is exported: the synthetic steps still update the weights."""
    from components.train import input_pipeline as pipeline

    worker_batch = global_batch // workers
    options = pipeline.PipelineOptions(image_size=config.image_size, batch_size=worker_batch, training=True,
                                       skip_corrupt=config.skip_corrupt, flip=config.flip,
                                       shuffle_buffer=config.shuffle_buffer)
    iterator = iter(pipeline.make_dataset(shards, options))
    batch = next(iterator)  # warm-up: fills the shuffle buffer and starts autotuning
    start = time.perf_counter()
    for _ in range(config.input_probe_steps):
        next(iterator)
    input_rate = config.input_probe_steps * worker_batch / (time.perf_counter() - start)

    def synthetic(context: tf.distribute.InputContext):
        per_replica = context.get_per_replica_batch_size(global_batch)
        return tf.data.Dataset.from_tensors((batch[0][:per_replica], batch[1][:per_replica])).repeat()

    # The compiled train step of the fit above, driven by hand: a second fit() would trip over the
    # state BackupAndRestore leaves behind, and this measures the step alone.
    train_step = model.make_train_function()
    batches = iter(strategy.distribute_datasets_from_function(synthetic))
    _sync(train_step(batches))  # warm-up: may trace once more for the new input signature
    calls = max(config.input_probe_steps // config.steps_per_execution, 1)
    start = time.perf_counter()
    for _ in range(calls):
        logs = train_step(batches)
    _sync(logs)
    synthetic_step = (time.perf_counter() - start) / (calls * config.steps_per_execution)
    model_rate = global_batch / synthetic_step / workers if synthetic_step else None
    waited = (max(real_step_seconds - synthetic_step, 0.0) * steps
              if real_step_seconds and synthetic_step else None)
    return {
        "input_images_per_sec": input_rate,
        "model_images_per_sec_synthetic": model_rate,
        "real_step_seconds": real_step_seconds,
        "synthetic_step_seconds": synthetic_step,
        "real_vs_synthetic": synthetic_step / real_step_seconds if real_step_seconds and synthetic_step else None,
        "input_wait_seconds": waited,
        "input_bound": bool(model_rate and input_rate < model_rate),
        "compression": shards[0].compression.lower() or "none",
        "cache": config.image_cache,
        **pipeline.stored_images(shards, config.image_size),
    }


class StepTimer(keras.callbacks.Callback):
    """Wall time between consecutive batch ends within an epoch: leaves out tracing/compilation of
    the first step, evaluation between epochs, and the profiled steps (tracing slows them)."""

    def __init__(self, skip: tuple[int, int] | int = 0):
        super().__init__()
        self.seconds = 0.0
        self.steps = 0
        self._last = None
        self._skip = range(skip[0] - 1, skip[1] + 1) if skip else range(0)  # Keras counts steps from 1

    def on_epoch_begin(self, epoch, logs=None):
        self._last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self._last is not None and batch not in self._skip:
            self.seconds += now - self._last[0]
            self.steps += batch - self._last[1]
        self._last = (now, batch)

    def step_seconds(self) -> float | None:
        return self.seconds / self.steps if self.steps else None

    def images_per_sec(self, global_batch: int) -> float | None:
        return global_batch / self.step_seconds() if self.steps else None


def _sync(logs) -> None:
    """Waits for a step's results: device work runs asynchronously until a value is read."""
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)
