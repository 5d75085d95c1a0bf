"""The report's first lines: a collapsed model and training's warnings, with advice that fits the run's
settings and names the presets as they are."""
from __future__ import annotations

from pathlib import Path

from components.common.files import read_result
from components.contracts.results import Collapse, GateResult, TrainMetrics
from components.contracts.summaries import IngestSummary, NearDuplicates
from components.report.headline import alerts

SAMPLES = Path(__file__).parents[1] / "contracts" / "samples"


def _collapsed() -> GateResult:
    gate = read_result(str(SAMPLES / "gate.json"), GateResult)
    return gate.model_copy(update={"collapse": Collapse(label="cat", answered=15, actual=5, example_count=15)})


def test_a_collapse_from_scratch_points_to_pretrained_weights_and_the_cpu_preset():
    train = read_result(str(SAMPLES / "metrics.json"), TrainMetrics)
    (alert,) = alerts(_collapsed(), train, {"train": {"network": "efficientnet_b0", "weights": "none"}}, 120)
    assert alert.startswith("The model answers one class: `cat` for 15 of 15 eval images")
    assert "efficientnet_b0 trained from scratch" in alert and "train.weights: imagenet" in alert
    assert "`--preset cpu` (small_cnn from scratch at 64 px, at least 600 steps" in alert


def test_a_collapse_after_fine_tuning_does_not_advise_what_the_run_did():
    train = read_result(str(SAMPLES / "metrics.json"), TrainMetrics)
    (alert,) = alerts(_collapsed(), train, {"train": {"network": "efficientnet_b0", "weights": "imagenet"}}, 2000)
    assert "from scratch" not in alert and "train.weights: imagenet" not in alert
    assert "train.head_epochs" in alert


def test_every_training_warning_follows():
    train = read_result(str(SAMPLES / "metrics.json"), TrainMetrics)
    train = train.model_copy(update={"warnings": ["eval accuracy stayed at 0.33, ...", "only 12 training steps"]})
    assert alerts(None, train, None) == ["Training: eval accuracy stayed at 0.33, ...", "Training: only 12 training steps"]


def test_ingest_warning_that_near_copies_moved_eval_comes_first():
    ingest = IngestSummary(published=True, near_duplicates=NearDuplicates(
        count=1667, examples=[], moved=214, warning="following near-copies left eval 73 of 1797 new images"))
    assert alerts(_collapsed(), None, None, None, ingest)[0] == (
        "Ingest: following near-copies left eval 73 of 1797 new images.")
    assert alerts(None, None, None, None, ingest.model_copy(update={"near_duplicates": None})) == []
