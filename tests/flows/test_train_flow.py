"""The `train` flow on real digits: every stage, the report, the GPU limit, the ways a run ends."""
from __future__ import annotations

import json
import os
import pathlib

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from components.common.files import read_json, read_result, write_bytes
from components.common.repository import Repository
from components.common.spans import Spans
from components.contracts.config import PreflightConfig
from components.contracts.layout import Root
from components.contracts.results import TrainMetrics
from components.contracts.run_config import Timeouts
from components.contracts.stages import STAGES
from flows.pipeline import GPU_TAG, finished_training, pipeline
from tests.flows.conftest import TINY_BEAM, copy_of

SAMPLES = pathlib.Path(__file__).parents[1] / "components" / "contracts" / "samples"


def test_end_to_end_a_blessed_model_is_pushed_and_reported(pushed_run):
    assert pushed_run["completed"], pushed_run["message"]
    summary = pushed_run["summary"]
    run = Root(pushed_run["root"]).run("first")
    version = summary["pushed_version"]
    assert summary["status"] == "pushed" and summary["blessed"] and version
    assert Repository(pushed_run["root"], "stoke").versions() == [version]
    assert os.path.exists(os.path.join(pushed_run["root"], "models", "stoke", str(version), "saved_model.pb"))

    # Every stage left its result; the report is built from them and says the same as the flow.
    for stage in ("preflight", "ingest", "train", "gate", "push"):
        assert os.path.exists(run.result(stage)), stage
    assert not os.path.exists(os.path.join(run.uri, "summaries"))  # written once: no copy beside them
    report = read_json(run.report_json)
    assert report["status"] == summary["status"] == "pushed"
    assert report["ingest"]["counts"]["train"] + report["ingest"]["counts"]["eval"] == 40
    assert report["train"]["images_per_sec"] > 0 and report["train"]["input_bound"] in (True, False)
    assert set(report["gate"]["metrics"]["per_class_accuracy"]) <= set(report["gate"]["labels"])
    assert report["push"]["commands"]
    for plot in ("curves", "confusion_matrix", "throughput"):
        assert open(report["plots"][plot], "rb").read(8) == b"\x89PNG\r\n\x1a\n", plot
    markdown = open(run.report_md).read()
    for heading in ("## Preflight", "## Ingest", "## Training", "## Gate", "## Push"):
        assert heading in markdown
    assert f"Version **{version}**" in markdown and "| class | eval examples | accuracy |" in markdown


def test_training_holds_the_gpu_limit_and_the_run_leaves_artifacts(pushed_run):
    tags, artifacts = pushed_run["task_tags"], pushed_run["artifacts"]  # as the Prefect API had them
    assert GPU_TAG in tags["train"] and GPU_TAG in tags["gate"] and GPU_TAG not in tags["ingest"]
    report = [a for a in artifacts if a["key"] == "report-first"]
    assert report and "## Push" in report[0]["data"] and "data:image/png;base64," in report[0]["data"]
    progress = [a for a in artifacts if a["type"] == "progress"]
    assert len(progress) == 2 and all(a["data"] == 100.0 for a in progress)  # ingest and train
    card = [a for a in artifacts if a["key"] == "model-card-first"]  # the pushed version's, as the push wrote it
    assert card and card[0]["data"] == open(pushed_run["summary"]["push"]["model_card"]).read()
    assert card[0]["data"].startswith("# Model card: stoke version ")


def test_nothing_new_with_a_served_model_ends_early_without_training(pushed_run, tmp_path):
    source, root = copy_of(pushed_run, tmp_path)
    state = pipeline(source=source, root=root, preflight=None, beam_args=TINY_BEAM,
                     skip_unchanged=True, run_id="nothing-new", return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["status"] == "skipped" and "already served" in summary["message"]
    run = Root(root).run("nothing-new")
    assert [s.name for s in STAGES if os.path.exists(run.result(s.name))] == ["ingest"]
    assert not os.path.exists(run.metrics)
    assert Repository(root, "stoke").versions() == [pushed_run["summary"]["pushed_version"]]
    # It ended by applying the retention rule to ROOT/runs: the served model's run stays whole.
    assert summary["run_folders"].startswith("Run folders: ") and read_json(run.retention)["error"] is None
    assert os.path.exists(Root(root).run("first").candidate)


def test_a_failed_preflight_check_stops_the_run_before_ingest(digits, tmp_path):
    root = str(tmp_path / "root")
    state = pipeline(source=digits, root=root, preflight=PreflightConfig(min_read_mbps=1_000_000, sample_mb=16),
                     run_id="slow-disk", return_state=True)
    assert state.is_failed()
    run = Root(root).run("slow-disk")
    assert [s.name for s in STAGES if os.path.exists(run.result(s.name))] == ["preflight"]
    report = json.load(open(run.report_json))
    assert report["status"] == "failed" and "read throughput failed" in report["message"]
    assert not Spans(root).manifests()


def test_a_stage_that_times_out_is_stopped_and_not_retried(digits, tmp_path):
    state = pipeline(source=digits, root=str(tmp_path / "root"), preflight=None, beam_args=TINY_BEAM,
                     timeouts=Timeouts(ingest=0.02), run_id="too-slow", return_state=True)
    assert state.is_failed() and "ingest timed out after 1 s" in state.message
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    (ingest,) = [t for t in tasks if t.name.startswith("ingest")]
    assert ingest.run_count == 1 and ingest.state.is_failed()
    report = read_json(Root(str(tmp_path / "root")).run("too-slow").report_json)
    assert report["status"] == "failed" and "timed out" in report["message"]


def test_a_run_pruned_to_its_record_is_not_taken_for_trained(tmp_path):
    """A retried flow run gates what training finished: metrics.json beside a whole candidate. The retention
    rule keeps metrics.json in a pruned run's record and removes the candidate's saved_model.pb first."""
    run = Root(str(tmp_path / "root")).run("pruned")
    write_bytes(run.metrics, (SAMPLES / "metrics.json").read_bytes())
    assert finished_training(run) is None
    write_bytes(run.saved_model, b"graph")
    assert finished_training(run) == read_result(run.metrics, TrainMetrics)
