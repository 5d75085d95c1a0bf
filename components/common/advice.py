"""What to change when a run learned nothing: the likely causes this run's settings point to and the
fixes to try first. Training's warnings (components/train/trainer.py) and the report's alerts
(components/report/headline.py) say the same, from the same settings."""
from __future__ import annotations

from components.contracts.config import network_parts
from components.contracts.presets import PRESETS

# Fewer training images a class than this, and a network trained from scratch has little to learn from.
FEW_PER_CLASS = 50


def cpu_preset() -> str:
    """The cpu preset in words, from its values."""
    cpu = PRESETS["cpu"]["train"]
    return (f"`--preset cpu` ({cpu['network']} from scratch at {cpu['image_size']} px, at least {cpu['min_steps']} "
            "steps: minutes on a CPU)")


def causes_and_fixes(network: str | None, weights: str | None, per_class: int | None) -> tuple[list[str], list[str]]:
    """The likely causes and the fixes, for a run of `network` from `weights` with about `per_class`
    training images a class (None: not known)."""
    causes, fixes = [], []
    # Large: a network made for ImageNet (a built-in one but small_cnn, keras.applications'); of the user's
    # own code, nothing is known.
    scratch = weights in (None, "none")
    large = network not in (None, "small_cnn") and network_parts(network)[0] in ("builtin", "application")
    if scratch and large:
        causes.append(f"{network} trained from scratch, a network made for millions of images")
        fixes.append("fine-tune pretrained weights (train.weights: imagenet, or the path of a local Keras .h5 such as "
                     "keras.applications' *_notop.h5), or " + cpu_preset())
    if per_class is not None and per_class < FEW_PER_CLASS:
        causes.append(f"about {per_class} training images a class")
        fixes.append("more images a class")
    if scratch and not large:
        fixes.append("more steps (train.min_steps, or train.epochs)")
    if not scratch and large:
        fixes.append("more head epochs (train.head_epochs; as many as train.epochs trains the head alone) or a lower "
                     "train.fine_tune_learning_rate")
    return causes, fixes


def in_words(causes: list[str], fixes: list[str]) -> str:
    return (f"Likely causes: {'; '.join(causes)}. " if causes else "") + f"Try: {'; or '.join(fixes)}."
