"""A run's phases. From scratch (or a whole small_cnn from a file), one phase trains everything. From
a pretrained backbone, the transfer recipe of Keras' guide "Transfer learning & fine-tuning"
(keras.io/guides/transfer_learning), which is what a few hundred photos need:

1. `head`: the backbone frozen (trainable = False), only the new head (dropout, logits) learns, at
   train.learning_rate. The guide trains the frozen model to convergence first because a randomly
   initialised head sends large gradients down the network, which would wreck the pretrained
   features if the backbone could move with them.
2. `fine_tune`: the backbone unfrozen, the whole network at train.fine_tune_learning_rate, far lower:
   the guide's reason is that the model is now much larger than the data, so large updates overfit
   at once; the pretrained features should only be nudged.

In both phases the backbone's batch normalization stays in inference mode (build_model(fine_tuning=True)
calls it with training=False), as the guide insists: unfrozen batch-norm layers would replace
ImageNet's moving statistics with those of a few small batches and undo what the model learned.

Each phase is its own compile() and fit(): the guide recompiles after changing `trainable`, since
compile() fixes which weights a model trains, and a new optimizer keeps Adam's moments, weight decay
and the weight average to the variables it trains. (One fit with a zero learning rate for the backbone
during the head phase would keep a single optimizer, but would still compute the frozen backbone's
gradients, and scaling gradients instead is no substitute: Adam's step does not shrink with them.)
Epoch numbers run on (the second fit starts at `initial_epoch`), so Keras, TensorBoard and the progress
events count 1..epochs. Each phase backs up into a folder of its own (RunDir.phase_backup); the head
phase backs up once more as it ends and keeps that backup, so a rerun of a run killed while fine-tuning
restores the finished head phase (its fit runs no epoch), then the fine-tuning phase's own backup, and
goes on where it was.
"""
from __future__ import annotations

import dataclasses

import tf_keras as keras

from components.common.files import exists, remove
from components.contracts.layout import RunDir
from components.contracts.run_config import TrainSettings


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


def pretrained(config: TrainSettings) -> bool:
    """Whether the run starts a keras.applications backbone from weights (the transfer recipe)."""
    return config.weights not in (None, "none") and config.network != "small_cnn"


def plan_phases(config: TrainSettings, epochs: int, steps_per_epoch: int) -> list[Phase]:
    """The phases of a run of `epochs` epochs: one, or the head then fine-tuning (either may be empty)."""
    if not pretrained(config):
        return [_phase(config, "all", 0, epochs, steps_per_epoch, config.learning_rate)]
    head = min(epochs, -(-epochs // 3) if config.head_epochs is None else config.head_epochs)
    phases = [_phase(config, "head", 0, head, steps_per_epoch, config.learning_rate)] if head else []
    if epochs > head:
        phases.append(_phase(config, "fine_tune", head, epochs - head, steps_per_epoch, config.fine_tune_learning_rate))
    return phases


def _phase(config: TrainSettings, name: str, first: int, epochs: int, steps_per_epoch: int, rate: float) -> Phase:
    from components.train import recipe

    steps = epochs * steps_per_epoch
    warmup = recipe.warmup_steps(config.lr_warmup_epochs, steps_per_epoch, steps) if config.schedule == "cosine" else 0
    return Phase(name=name, first_epoch=first, epochs=epochs, steps=steps, learning_rate=rate, warmup=warmup)


def prepare(model, phase: Phase, config: TrainSettings, num_classes: int, jit_compile: bool) -> None:
    """Freezes or unfreezes the backbone for `phase` and compiles the model with the phase's optimizer
    (under the strategy's scope, where Keras creates the optimizer's variables)."""
    from components.train import models, recipe

    backbone = models.backbone(model)
    if backbone is not None:
        backbone.trainable = phase.name != "head"
    with model.distribute_strategy.scope():
        optimizer = recipe.make_optimizer(recipe.learning_rate(config.schedule, phase.learning_rate, phase.warmup,
                                                               phase.steps),
                                          config.weight_decay, config.ema_momentum if config.ema else None)
        models.compile_model(model, optimizer, recipe.make_loss(num_classes, config.label_smoothing), jit_compile,
                             config.steps_per_execution)


class KeptBackup(keras.callbacks.BackupAndRestore):
    """The backup of a phase before the last: it backs up once more as the phase ends, whatever the save
    frequency, and keeps that backup, so that a rerun restores the phase finished instead of redoing it."""

    def __init__(self, folder: str, save_freq):
        super().__init__(folder, save_freq=save_freq, delete_checkpoint=False)

    def on_train_end(self, logs=None):
        if self.save_freq != "epoch" and self._batches_count:  # steps since the last backup
            self._backup(epoch=self._current_epoch)
        super().on_train_end(logs)


def backup(config: TrainSettings, work: RunDir, phases: list[Phase], phase: Phase) -> keras.callbacks.Callback:
    """The phase's BackupAndRestore: into `backup` for a run of one phase, else into the phase's own folder."""
    save_freq = config.backup_every or "epoch"
    if phase is not phases[-1]:
        return KeptBackup(work.phase_backup(phase.name), save_freq)
    folder = work.backup if len(phases) == 1 and phase.name == "all" else work.phase_backup(phase.name)
    return keras.callbacks.BackupAndRestore(folder, save_freq=save_freq)


def drop_backups(work: RunDir, run: RunDir, phases: list[Phase]) -> None:
    """Once the last phase is done, the backups phases kept (BackupAndRestore drops the last one's), and
    with a ROOT in a bucket the uploaded backup, as a run of one phase leaves them."""
    for phase in phases:
        if exists(work.phase_backup(phase.name)):
            remove(work.phase_backup(phase.name))
    if work is not run and exists(run.backup):
        remove(run.backup)


def merged(history: dict, more: dict) -> dict:
    """Keras' per-epoch logs of two phases, one after the other."""
    keys = list(history) + [key for key in more if key not in history]
    return {key: list(history.get(key, [])) + list(more.get(key, [])) for key in keys}


def trainable_parameters(model) -> int:
    return int(sum(int(v.shape.num_elements()) for v in model.trainable_variables))
