"""What a push leaves: a run's pushed.json (and push_intent.json before it), and the lineage of a
served version (assets.extra/stoke_lineage.json): served version -> run -> spans -> metrics, blessing."""
from __future__ import annotations

from components.contracts.label_set import LabelSet
from components.contracts.results import (
    Comparison,
    Environment,
    GateMetrics,
    LossAccuracy,
    Result,
    SpanCounts,
    Thresholds,
    TrainStart,
)


class Pushed(Result):
    """ROOT/runs/<id>/pushed.json: the version a run became."""

    version: int
    model_uri: str
    pushed_at: str


class PushIntent(Result):
    """ROOT/runs/<id>/push_intent.json: the version a push is about to publish, written before it."""

    version: int
    model_uri: str
    started_at: str


class LineageSpan(Result):
    span: int
    manifest_uri: str
    manifest_sha256: str
    source: str
    created: str
    counts: SpanCounts
    sources: int


class Training(Result):
    network: str  # its identity: its name, module:function or <file>.py:function
    image_size: int
    precision: str
    strategy: str
    epochs: int
    total_steps: int
    global_batch_size: int
    train: LossAccuracy
    eval: LossAccuracy
    start: TrainStart | None = None  # warm or full, from which version (None: pushed before warm starts)
    network_digest: str | None = None  # the SHA-256 of the network's code (None: pushed before it was recorded)


class Blessing(Result):
    blessed: bool
    reasons: list[str]
    notes: list[str]
    thresholds: Thresholds
    baseline_version: int | None
    gate_uri: str
    gated_at: str


class RolledBack(Result):
    at: str
    reason: str
    moved_to: str
    serving_now: int


class Lineage(Result):
    """assets.extra/stoke_lineage.json of a version: served version -> run -> spans -> metrics."""

    model_name: str
    version: int
    pushed_at: str
    run_id: str
    run_uri: str
    labels: list[str]
    spans: list[LineageSpan]
    training: Training
    metrics: GateMetrics
    blessing: Blessing
    tensorflow_version: str
    serving_image: str
    code_version: dict
    # The version whose recorded answers later candidates are held to class by class while this one is served:
    # itself after a full retrain, else the reference it was held to (components/gate/reference.py). None: the
    # version recorded no answers (pushed before the gate recorded them).
    reference: int | None = None
    rolled_back: RolledBack | None = None
    retired_at: str | None = None
    environment: Environment | None = None  # what it was trained with; None: pushed before Stoke recorded it
    untrained: list[str] = []  # classes of `labels` no record it was trained on carries: it never answers them

    @property
    def label_set(self) -> LabelSet:
        return LabelSet(self.labels, self.untrained)

    def trained_on(self) -> set[tuple[int, str]]:
        """(span, SHA-256 of its manifest) of each span the version was trained on: the number alone does not
        say which records (a span deleted by hand, its number published again, holds others)."""
        return {(span.span, span.manifest_sha256) for span in self.spans}


class CardSpan(Result):
    """A span a model learnt from, as its model card tells it."""

    span: int
    created: str
    source: str
    train: int
    eval: int
    data_check: str | None  # the data check's status of it (ok, warning, released); None: no record read
    warnings: list[str]  # the data check's findings about the span as a whole


class CardClass(Result):
    """One class of a model card: its records, and the model's accuracy on its eval records."""

    label: str
    train_records: int | None  # None: the spans' statistics could not be read
    eval_records: int
    right: int
    accuracy: float | None  # None: no eval record of the class
    interval: tuple[float, float] | None  # Wilson's score interval of the accuracy, at the card's confidence
    baseline_accuracy: float | None  # the replaced version's, on the same records; None: not compared
    verdict: str | None  # the gate's comparison of the class with the replaced version; None: none made


class ModelCard(Result):
    """assets.extra/model_card.json of a version, beside model_card.md, which says the same in words: what the
    model is for, what it learnt from, how well it does per class and against the version it replaced, what it
    ran on and what it is known not to do (components/push/model_card.py)."""

    model_name: str
    version: int
    run_id: str
    pushed_at: str
    network: str
    image_size: int
    labels: list[str]
    spans: list[CardSpan]
    classes: list[CardClass]
    example_count: int
    accuracy: float
    accuracy_interval: tuple[float, float]
    top_k: int
    top_k_accuracy: float
    confidence: float  # of every interval on the card
    replaced_version: int | None  # the served version the gate compared it with
    evidence: Comparison | None  # the gate's paired comparison with that version
    gate_notes: list[str]
    environment: Environment | None
    limitations: list[str]
