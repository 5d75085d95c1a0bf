"""How a run learns: the learning-rate schedule, AdamW, label smoothing and the weight average.

The schedule is a function of the optimizer's step counter, which BackupAndRestore restores, so a
resumed run continues the schedule where the backup left it. The exponential moving average of the
weights lives in the optimizer (tf_keras' `use_ema`); `EmaEvaluation` swaps it in for each
validation pass, so the accuracy a run reports per epoch is that of the weights it exports.
"""
from __future__ import annotations

import math

import tensorflow as tf
import tf_keras as keras

# Cosine decay ends at this share of the peak rate: near zero, so the last steps only settle.
FINAL_FRACTION = 0.01
# Warm-up never takes more than this share of the run (a short run still gets its decay).
MAX_WARMUP_SHARE = 0.2
# A run from scratch with fewer optimizer steps is flagged as too short: the texture set of docs/train.md's
# Training section converged in 156 steps, the digits in 400; the tests' 12-step runs did not.
MIN_STEPS = 150
# Variables weight decay leaves alone: batch-norm scales and shifts, and biases.
NO_DECAY = ["gamma", "beta", "bias"]


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from peak/warmup to the peak over `warmup` steps, then cosine decay to
    FINAL_FRACTION x peak at `total` steps (and flat after, should a run go on)."""

    def __init__(self, peak: float, warmup: int, total: int):
        self.peak, self.warmup, self.total = float(peak), int(warmup), int(total)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = float(max(self.warmup, 1))
        rising = self.peak * tf.minimum(step + 1.0, warmup) / warmup
        progress = tf.clip_by_value((step - self.warmup) / float(max(self.total - self.warmup, 1)), 0.0, 1.0)
        falling = self.peak * (FINAL_FRACTION + (1 - FINAL_FRACTION) * 0.5 * (1 + tf.cos(math.pi * progress)))
        return tf.where(step < self.warmup, rising, falling)

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup, "total": self.total}


def warmup_steps(warmup_epochs: float, steps_per_epoch: int, total: int) -> int:
    return min(round(warmup_epochs * steps_per_epoch), int(total * MAX_WARMUP_SHARE))


def learning_rate(schedule: str, peak: float, warmup: int, total: int):
    return WarmupCosine(peak, warmup, total) if schedule == "cosine" else peak


class AdamW(keras.optimizers.AdamW):
    """Keras' AdamW whose weight average warms up as timm's does: the momentum at step t is
    min(ema_momentum, (1 + t) / (10 + t)), so the average follows the weights early on instead of
    holding on to the random initialisation for hundreds of steps (Keras starts it at full momentum)."""

    def _update_model_variables_moving_average(self, var_list):
        if not self.use_ema:
            return
        step = tf.cast(self.iterations, tf.float32)
        momentum = tf.minimum(self.ema_momentum, (1.0 + step) / (10.0 + step))

        def update(average, var):
            average.assign(momentum * average + (1.0 - momentum) * tf.cast(var, average.dtype))

        for var in var_list:
            average = self._model_variables_moving_average[self._index_dict[self._var_key(var)]]
            self._distribution_strategy.extended.update(average, update, args=(var,), group=False)


def make_optimizer(rate, weight_decay: float, ema_momentum: float | None) -> keras.optimizers.Optimizer:
    """AdamW (decoupled weight decay; plain Adam when it is 0), with the weight average when asked."""
    optimizer = AdamW(learning_rate=rate, weight_decay=weight_decay,
                      use_ema=ema_momentum is not None, ema_momentum=ema_momentum or 0.99)
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer


def make_loss(num_classes: int, label_smoothing: float):
    """Cross-entropy on logits against integer labels; Keras' sparse loss has no label smoothing,
    so with smoothing the labels become one-hot first."""
    if not label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def smoothed(labels, logits):  # per example: compile() reduces it, also under a strategy
        one_hot = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), num_classes)
        return keras.losses.categorical_crossentropy(one_hot, logits, from_logits=True, label_smoothing=label_smoothing)
    return smoothed


def average_pairs(model: keras.Model) -> list[tuple[tf.Variable, tf.Variable]]:
    """(model variable, its moving average) for every trainable variable; empty without EMA."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)  # under a loss scale
    if not getattr(optimizer, "use_ema", False) or not hasattr(optimizer, "_model_variables_moving_average"):
        return []
    averages = optimizer._model_variables_moving_average
    return [(v, averages[optimizer._index_dict[optimizer._var_key(v)]]) for v in model.trainable_variables]


def swap_average(model: keras.Model) -> None:
    """Exchanges the model's trainable weights with their moving averages (twice restores them)."""
    for variable, average in average_pairs(model):
        current = tf.identity(variable)
        variable.assign(average)
        average.assign(current)


class EmaEvaluation(keras.callbacks.Callback):
    """Validation passes see the averaged weights; training continues on the raw ones."""

    def on_test_begin(self, logs=None):
        swap_average(self.model)

    def on_test_end(self, logs=None):
        swap_average(self.model)


class LearningRateLog(keras.callbacks.Callback):
    """Adds the rate of the epoch's last step to the history as `learning_rate`."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(tf.keras.backend.get_value(self.model.optimizer.learning_rate))
