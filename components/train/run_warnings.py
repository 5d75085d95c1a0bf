"""What metrics.json warns about: a run from scratch too short to converge, and one that learned
nothing, whose eval accuracy stayed at the eval split's majority share while train accuracy rose (the
model memorised the training images: on 150 photos, efficientnet_b0 from scratch scores 1.00 on
them and the majority's 0.33 on the eval split, epoch after epoch).
"""
from __future__ import annotations

import collections

import tensorflow as tf

from components.common import advice
from components.contracts import schema
from components.contracts.run_config import TrainSettings

# Train accuracy "rose" when its last epoch is this far above its first and above the majority share.
RISE = 0.1


def warnings(config: TrainSettings, plan, history: dict) -> list[str]:
    """The run's warnings, for metrics.json (`plan`: the RunPlan)."""
    found = short_run_warnings(plan.total, config.weights)
    flat = learned_nothing(history, plan.eval_records, lambda: eval_labels(plan.eval_shards, config.skip_corrupt))
    if flat:
        per_class = round(plan.train_records / len(plan.labels)) if plan.labels else None
        majority, count = flat
        found.append(f"eval accuracy stayed at {max(history['val_accuracy']):.2f}, the share of the eval split's most "
                     f"common class ({plan.labels[majority] if majority < len(plan.labels) else majority}: {count} of "
                     f"{plan.eval_records}), while train accuracy rose from {history['accuracy'][0]:.2f} to "
                     f"{history['accuracy'][-1]:.2f}: the model learned the training images, not what tells the "
                     "classes apart. " + advice.in_words(*advice.causes_and_fixes(config.network, config.weights,
                                                                                  per_class)))
    return found


def short_run_warnings(total_steps: int, weights: str | None) -> list[str]:
    """A run from scratch of fewer steps than models need to converge."""
    from components.train.recipe import MIN_STEPS

    if weights == "none" and total_steps < MIN_STEPS:
        return [f"only {total_steps} training steps: a model trained from scratch rarely converges in fewer "
                f"than {MIN_STEPS}; train more epochs, or on more data"]
    return []


def learned_nothing(history: dict, eval_records: int, labels) -> tuple[int, int] | None:
    """(the majority class, its eval records) when every epoch's eval accuracy is within one record of
    that class's share while train accuracy rose beyond it; else None. `labels()` gives the eval
    split's labels: read only when the eval accuracy is flat enough to be the majority's."""
    val, train = history.get("val_accuracy") or [], history.get("accuracy") or []
    if len(val) < 2 or len(train) < 2 or not eval_records:
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
    if train[-1] - train[0] < RISE or train[-1] < share + RISE:
        return None
    return majority, count


def eval_labels(shards, skip_corrupt: bool) -> list[int]:
    """The label of every eval record, read without decoding an image."""
    spec = {schema.LABEL: schema.feature_spec()[schema.LABEL]}
    labels = []
    for shard in shards:
        records = tf.data.TFRecordDataset(shard.uri, compression_type=shard.compression)
        if skip_corrupt:
            records = records.ignore_errors()
        parsed = records.batch(1024).map(lambda batch: tf.io.parse_example(batch, spec)[schema.LABEL])
        labels += [int(v) for batch in parsed for v in batch.numpy().reshape(-1)]
    return labels
