"""What a push leaves: a run's pushed.json (and push_intent.json before it), and the lineage of a
served version (assets.extra/stoke_lineage.json): served version -> run -> spans -> metrics, blessing."""
from __future__ import annotations

from components.contracts.results import GateMetrics, LossAccuracy, Result, SpanCounts, Thresholds, TrainStart


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
    network: str
    image_size: int
    precision: str
    strategy: str
    epochs: int
    total_steps: int
    global_batch_size: int
    train: LossAccuracy
    eval: LossAccuracy
    start: TrainStart | None = None  # warm or full, from which version (None: pushed before warm starts)


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
    rolled_back: RolledBack | None = None
    retired_at: str | None = None

    def trained_on(self) -> set[tuple[int, str]]:
        """(span, SHA-256 of its manifest) of each span the version was trained on: the number alone does not
        say which records (a span deleted by hand, its number published again, holds others)."""
        return {(span.span, span.manifest_sha256) for span in self.spans}
