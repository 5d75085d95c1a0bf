"""How a run learns: its phases, the learning-rate schedule, AdamW, label smoothing and the weight average.

From scratch, or from weights of a network that names no backbone (a whole small_cnn from a file, say), one
phase trains everything. From a pretrained backbone (the part a network's function returns beside its model:
components/common/networks.py), the transfer recipe of Keras' guide "Transfer learning & fine-tuning"
(keras.io/guides/transfer_learning), which is what a few hundred photos need:

1. `head`: the backbone frozen (trainable = False), only the new head (dropout, logits) learns, at
   train.learning_rate. The guide trains the frozen model to convergence first because a randomly
   initialised head sends large gradients down the network, which would wreck the pretrained
   features if the backbone could move with them.
2. `fine_tune`: the backbone unfrozen, the whole network at train.fine_tune_learning_rate, far lower:
   the guide's reason is that the model is now much larger than the data, so large updates overfit
   at once; the pretrained features should only be nudged.

In both phases the backbone's batch normalization stays in inference mode (the built-in networks call a
backbone started from weights with training=False, as a network of the user's should), as the guide insists:
unfrozen batch-norm layers would replace ImageNet's moving statistics with those of a few small batches and
undo what the model learned.

Each phase is its own compile() and fit(): the guide recompiles after changing `trainable`, since
compile() fixes which weights a model trains, and a new optimizer keeps Adam's moments, weight decay
and the weight average to the variables it trains. (One fit with a zero learning rate for the backbone
during the head phase would keep a single optimizer, but would still compute the frozen backbone's
gradients, and scaling gradients instead is no substitute: Adam's step does not shrink with them.)
Epoch numbers run on (the second fit starts at `initial_epoch`), so Keras, TensorBoard and the progress
events count 1..epochs. Each phase backs up into a folder of its own (trainer.py says how a run resumes).

The schedule is a function of the optimizer's step counter, which BackupAndRestore restores, so a
resumed run continues the schedule where the backup left it. The exponential moving average of the
weights lives in the optimizer (tf_keras' `use_ema`); `EmaEvaluation` swaps it in for each
validation pass, so the accuracy a run reports per epoch is that of the weights it exports.
"""
from __future__ import annotations

import dataclasses
import math

import tensorflow as tf
import tf_keras as keras

from components.common.networks import backbone
from components.contracts.config import TrainConfig
from components.train.models import compile_model

# Cosine decay ends at this share of the peak rate: near zero, so the last steps only settle.
FINAL_FRACTION = 0.01
# Warm-up never takes more than this share of the run (a short run still gets its decay).
MAX_WARMUP_SHARE = 0.2
# Variables weight decay leaves alone: batch-norm scales and shifts, and biases.
NO_DECAY = ["gamma", "beta", "bias"]


# ---------------------------------------------------------------- phases

@dataclasses.dataclass(frozen=True)
class Phase:
    name: str  # "all" (one phase: everything trains), "head" (the backbone frozen), "fine_tune" (all of it)
    first_epoch: int  # counted from 0 over the whole run
    epochs: int
    steps: int
    learning_rate: float  # the peak of this phase's schedule
    warmup: int  # steps of its linear warm-up

    @property
    def end_epoch(self) -> int:
        return self.first_epoch + self.epochs


def pretrained(train: TrainConfig, has_backbone: bool) -> bool:
    """Whether the run starts a network's backbone from weights (the transfer recipe)."""
    return train.weights not in (None, "none") and has_backbone


# A warm run (warm.py) fine-tunes the served network on the new data and a replay sample: one phase, every
# layer trainable, a short warm-up (the optimizer's moments start afresh, so its first steps are the
# largest) then cosine decay from a lower peak than a run from scratch takes. Li et al. 2020 ("Rethinking
# the Hyperparameters for Fine-tuning", ICLR) find the best fine-tuning rate falls as the target data
# gets closer to the source's, but not to nothing; here the two are one stream a night apart. On the
# digits (demo preset, a night of 400 then four of 225), four warm nights at a third of the from-scratch
# peak ended at 0.953 held-out accuracy (no class below 0.889), at a tenth at 0.933 (0.852), against
# 0.966 for a full run on all of it: a third learns the new records and keeps the old.
WARM_RATE_SHARE = 1 / 3
WARM_WARMUP_SHARE = 0.05


def warm_rate(train: TrainConfig, has_backbone: bool) -> float:
    """A warm run's peak learning rate: train.warm_learning_rate, else a third of train.learning_rate (a
    pretrained backbone: train.fine_tune_learning_rate)."""
    if train.warm_learning_rate is not None:
        return train.warm_learning_rate
    return train.fine_tune_learning_rate if pretrained(train, has_backbone) else train.learning_rate * WARM_RATE_SHARE


def plan_phases(train: TrainConfig, epochs: int, steps_per_epoch: int, *, warm: bool = False,
                has_backbone: bool) -> list[Phase]:
    """The phases of a run of `epochs` epochs of a network with or without a backbone: one, or the head then
    fine-tuning (either may be empty); a warm run is one phase that trains everything at the warm rate."""
    if warm:
        steps = epochs * steps_per_epoch
        warmup = min(warmup_steps(train.lr_warmup_epochs, steps_per_epoch, steps),
                     int(steps * WARM_WARMUP_SHARE)) if train.schedule == "cosine" else 0
        return [Phase(name="all", first_epoch=0, epochs=epochs, steps=steps,
                      learning_rate=warm_rate(train, has_backbone), warmup=warmup)]
    if not pretrained(train, has_backbone):
        return [_phase(train, "all", 0, epochs, steps_per_epoch, train.learning_rate)]
    head = min(epochs, -(-epochs // 3) if train.head_epochs is None else train.head_epochs)
    phases = [_phase(train, "head", 0, head, steps_per_epoch, train.learning_rate)] if head else []
    if epochs > head:
        phases.append(_phase(train, "fine_tune", head, epochs - head, steps_per_epoch, train.fine_tune_learning_rate))
    return phases


def _phase(train: TrainConfig, name: str, first: int, epochs: int, steps_per_epoch: int, rate: float) -> Phase:
    steps = epochs * steps_per_epoch
    warmup = warmup_steps(train.lr_warmup_epochs, steps_per_epoch, steps) if train.schedule == "cosine" else 0
    return Phase(name=name, first_epoch=first, epochs=epochs, steps=steps, learning_rate=rate, warmup=warmup)


def prepare(model, phase: Phase, train: TrainConfig, num_classes: int, jit_compile: bool) -> None:
    """Freezes or unfreezes the backbone for `phase` and compiles the model with the phase's optimizer
    (under the strategy's scope, where Keras creates the optimizer's variables)."""
    base = backbone(model)
    if base is not None:
        base.trainable = phase.name != "head"
    with model.distribute_strategy.scope():
        optimizer = make_optimizer(learning_rate(train.schedule, phase.learning_rate, phase.warmup, phase.steps),
                                   train.weight_decay, train.ema_momentum if train.ema else None)
        compile_model(model, optimizer, make_loss(num_classes, train.label_smoothing), jit_compile,
                      train.steps_per_execution)


def merged(history: dict, more: dict) -> dict:
    """Keras' per-epoch logs of two phases, one after the other."""
    keys = list(history) + [key for key in more if key not in history]
    return {key: list(history.get(key, [])) + list(more.get(key, [])) for key in keys}


def trainable_parameters(model) -> int:
    return int(sum(int(v.shape.num_elements()) for v in model.trainable_variables))


# ---------------------------------------------------------------- the schedule, the optimizer, the loss, the average

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
