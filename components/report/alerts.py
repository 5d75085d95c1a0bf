"""The report's first lines: what a user must know before reading on. A model that answers one class
learned the majority, not the pictures; the report says so, with the causes this run's settings point
to and what to change, and repeats every warning training raised."""
from __future__ import annotations

from components.contracts.results import GateResult, TrainMetrics

# Fewer training images a class than this, and a network trained from scratch has little to learn from.
FEW_PER_CLASS = 50


def alerts(gate: GateResult | None, train: TrainMetrics | None, config: dict | None,
           train_records: int | None = None) -> list[str]:
    """Sentences for the top of the report: the collapse, then training's warnings. `config` is the
    run's config.json; `train_records` the training records of the spans it trained on."""
    found = []
    if gate is not None and gate.collapse is not None:
        c = gate.collapse
        found.append(f"The model answers one class: `{c.label}` for {c.answered} of {c.example_count} eval images "
                     f"({c.actual} of them are {c.label}). It learned the most common answer, not the pictures. "
                     + _fix(train, config, train_records))
    found += [f"Training: {warning}" for warning in (train.warnings if train is not None else [])]
    return found


def _fix(train: TrainMetrics | None, config: dict | None, train_records: int | None) -> str:
    """The likely causes, from what this run trained, and the change to try first."""
    settings = (config or {}).get("train") or {}
    network, weights = settings.get("network") or (train.network if train else None), settings.get("weights", "none")
    per_class = round(train_records / len(train.labels)) if train is not None and train.labels and train_records else None
    causes, fixes = [], []
    if weights == "none" and network not in (None, "small_cnn"):
        causes.append(f"{network} trained from scratch, a network made for millions of images")
        fixes.append("fine-tune pretrained weights (train.weights: imagenet, or a local Keras weights file), or "
                     "`--preset cpu` (a small network trained from scratch, at a size that suits a CPU)")
    if per_class is not None and per_class < FEW_PER_CLASS:
        causes.append(f"about {per_class} training images a class")
        fixes.append("more images a class")
    if not fixes:
        fixes.append("a smaller network (train.network: small_cnn) or more epochs (train.epochs)")
    return (f"Likely causes: {'; '.join(causes)}. " if causes else "") + f"Try: {'; or '.join(fixes)}."
