"""Evaluation that counts every eval record exactly once per epoch, in whole batches.

Keras evaluates in whole batches: XLA compiles one static shape, and under a strategy every replica
of every worker runs every step. The eval split rarely fills its last batch, and repeating records
to fill it made training's per-epoch figures differ from the gate's (TFMA scores each record once).
So each input pipeline appends blank examples to its records up to the same number of whole
batches, and every example carries a sample weight, 0 for a blank one. The trade-off: up to a batch
of wasted predictions per replica and step count (more on a worker whose share of the records is
short), for one compiled program and the same exact figures under every strategy.

A record's weight is not 1 but predictions / records (the padded count over the record count).
tf_keras averages the loss per batch over the whole batch, blanks included, and its loss metric
weighs each batch by its size; with that weight the sum over records divided by every prediction
made is the mean over the records. Accuracy (a weighted metric: the weighted sum over the sum of
weights) does not change with the scale. Metric totals are summed over replicas and workers before
they are read, so the figures are exact on one device, mirrored, and across workers alike.
"""
from __future__ import annotations

import math

import tensorflow as tf


def by_file(shards: int, pipelines: int) -> bool:
    """Whether input pipelines share the files (every pipeline gets one at least) rather than the
    records of every file (each reads everything and keeps 1/N)."""
    return pipelines > 1 and shards >= pipelines


def pipeline_records(counts: list[int], pipelines: int) -> list[int]:
    """The records each input pipeline reads of shards holding `counts`, as the input pipeline
    shards them (components/train/input_pipeline.py)."""
    if by_file(len(counts), pipelines):
        return [sum(counts[index::pipelines]) for index in range(pipelines)]
    total = sum(counts)
    return [total // pipelines + (index < total % pipelines) for index in range(pipelines)]


def steps(counts: list[int], pipelines: int, global_batch: int) -> int:
    """Evaluation steps that cover every pipeline's records: the same on every worker, as
    collective steps must be; 0 without records."""
    pipeline_batch = global_batch // pipelines
    return max(math.ceil(records / pipeline_batch) for records in pipeline_records(counts, pipelines))


def record_weight(records: int, eval_steps: int, global_batch: int) -> float:
    """Every prediction made over the records evaluated (see the module's docstring)."""
    return eval_steps * global_batch / records


def padded(examples: tf.data.Dataset, size: int, weight: float) -> tf.data.Dataset:
    """(image, label, weight) examples: `examples` weighted `weight`, then blanks (zeros, weight 0)
    up to `size`; `size` must hold every record, and is a whole number of batches."""
    weighed = examples.map(lambda image, label: (image, label, tf.constant(weight, tf.float32)))
    blank = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), weighed.element_spec)
    return weighed.concatenate(tf.data.Dataset.from_tensors(blank).repeat()).take(size)
