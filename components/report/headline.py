"""The report's first lines: what a user must know before reading on. A model that answers one class
learned the majority, not the pictures; the report says so, with the causes this run's settings point
to and what to change (components/common/advice.py, as training's warnings say it), and repeats every
warning training raised, and ingest's when following near-copies moved the eval share."""
from __future__ import annotations

from components.common import advice
from components.contracts.results import GateResult, TrainMetrics
from components.contracts.summaries import IngestSummary


def alerts(gate: GateResult | None, train: TrainMetrics | None, config: dict | None,
           train_records: int | None = None, ingest: IngestSummary | None = None) -> list[str]:
    """Sentences for the top of the report: ingest's warning, the collapse, then training's warnings.
    `config` is the run's config.json; `train_records` the training records of the spans it trained on."""
    near = ingest.near_duplicates if ingest is not None else None
    found = [f"Ingest: {near.warning}."] if near is not None and near.warning else []
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
    network = settings.get("network") or (train.network if train else None)
    weights = settings.get("weights") or (train.weights if train else None) or "none"
    per_class = round(train_records / len(train.labels)) if train is not None and train.labels and train_records else None
    return advice.in_words(*advice.causes_and_fixes(network, weights, per_class))
