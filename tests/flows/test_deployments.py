"""The deployments: train/nightly on its cron and on stoke.data.arrived (one at a time), and
watch-bucket/poll on an interval; an arrival event really runs train/nightly."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest
from prefect import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.events import emit_event
from prefect.settings import PREFECT_API_URL

from beam_jobs.ingest import run as ingest
from components.common.files import read_json
from components.common.repository import Repository
from components.common.spans import Spans
from components.contracts.run_config import RunConfig
from flows.deployments import ARRIVED, build_deployments
from flows.watch_bucket import EVENT, source_resource
from tests.credentials import PASSWORD, TOKEN, USER, shows
from tests.flows.conftest import TINY_BEAM, TINY_MODEL, copy_of, one_class_night
from tests.waiting import wait_for

TRIGGER = "train when data arrives"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture
def client():
    with get_client(sync_client=True) as client:
        yield client
        # Left behind, the trigger would answer other tests' events with runs nobody serves.
        for name in ("train/nightly", "watch-bucket/poll"):
            try:
                client.delete_deployment(client.read_deployment_by_name(name).id)
            except Exception:  # not created by this test
                pass
        for automation in client.read_automations_by_name(TRIGGER):
            client.delete_automation(automation.id)


def test_schedule_trigger_and_queue_are_registered(client, tmp_path):
    source, root = str(tmp_path / "bucket"), str(tmp_path / "root")
    for deployment in build_deployments(RunConfig(source=source, root=root), poll_seconds=90, timezone="Europe/Berlin"):
        deployment.apply()

    nightly = client.read_deployment_by_name("train/nightly")
    (schedule,) = nightly.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == ("0 2 * * *", "Europe/Berlin", True)
    assert nightly.parameters == {"source": source, "root": root, "skip_unchanged": True}
    assert nightly.global_concurrency_limit.limit == 1
    assert nightly.concurrency_options.collision_strategy.value == "ENQUEUE"
    assert nightly.entrypoint == "flows.pipeline.pipeline"
    (automation,) = client.read_automations_by_name(TRIGGER)
    assert automation.trigger.expect == {EVENT}
    assert automation.trigger.match.model_dump() == {"prefect.resource.id": "stoke.source.*"}
    (action,) = automation.actions
    assert action.deployment_id == nightly.id
    assert action.parameters == {"source": "{{ event.payload.source }}", "arrived": ARRIVED}

    poll = client.read_deployment_by_name("watch-bucket/poll")
    (schedule,) = poll.schedules
    assert schedule.schedule.interval.total_seconds() == 90
    assert poll.parameters == {"source": source, "root": root, "settle_seconds": 22.5}


def test_the_deployments_record_source_without_its_password(tmp_path):
    """Prefect keeps and shows a deployment's parameters: SOURCE's password stays in the environment of
    the process that serves them (`stoke up`) or of the workers (STOKE_SOURCE)."""
    source = f"https://{USER}:{PASSWORD}@127.0.0.1:9/photos/manifest.csv?code={TOKEN}"
    nightly, poll = build_deployments(RunConfig(source=source, root=str(tmp_path)), notifications="sqs://q")
    assert nightly.parameters["source"] == poll.parameters["source"] == "https://alice:***@127.0.0.1:9/photos/manifest.csv"
    assert not shows(json.dumps([nightly.parameters, poll.parameters]))


def test_with_notifications_the_watcher_reads_the_queue_and_events_name_what_ingest_reads(client, tmp_path):
    source, root = "s3://photos/incoming", str(tmp_path / "root")
    for deployment in build_deployments(RunConfig(source=source, root=root), poll_seconds=60,
                                        notifications="sqs://stoke-arrivals"):
        deployment.apply()
    poll = client.read_deployment_by_name("watch-bucket/poll")
    assert poll.parameters == {"source": source, "root": root, "settle_seconds": 15.0,
                               "notifications": "sqs://stoke-arrivals", "wait_seconds": 20.0}

    # The trigger's template, rendered as Prefect's automations render it: the files an event names,
    # one a line; nothing (list all of SOURCE) for a poll's event, which names none.
    from prefect.server.utilities.user_templates import render_user_template_sync

    named = {"source": source, "new_files": 2, "files": [f"{source}/a/1.png", f"{source}/b/2.png"]}
    assert render_user_template_sync(ARRIVED, {"event": {"payload": named}}) == "\n".join(named["files"])
    assert render_user_template_sync(ARRIVED, {"event": {"payload": {"source": source, "new_files": 2}}}) == ""


def test_an_arrival_event_runs_train_nightly_on_a_span_never_checked_and_a_refused_model_completes(
        client, pushed_run, tmp_path):
    """A copy of the served ROOT, whose source a night of one class lands in (sevens only: one line, one
    camera); a `stoke ingest` by hand published them and nothing checked them (as a run stopped before its
    data check leaves a span). The event's run, scheduled-style (it skips when nothing is new), checks that
    span, the served model judging its labels, and trains on it too, with the warning of its skewed mix: a
    span is never stranded for being published outside a run, nor for being of one class. The deployment's
    own default source is elsewhere: the run must take the event's."""
    source, root = copy_of(pushed_run, tmp_path)
    one_class_night(source, tmp_path / "pool")
    assert ingest([source, "--root", root, *TINY_BEAM]) == 0  # by hand: published, never checked
    assert {s.span for s in Spans(root).shards("train")} == {1}  # training would not read it yet
    config = {"source": "/nowhere", "root": root, "preflight": None,
              "preset": "demo", "train": TINY_MODEL, "gate": {"min_accuracy": 1.0, "max_regression": 0.0},
              "push": {"build_image": False}, "beam_args": TINY_BEAM}
    code = ("import json, sys; from flows.deployments import serve_deployments; "
            "from components.contracts.run_config import RunConfig; "
            "serve_deployments(RunConfig.model_validate(json.loads(sys.argv[1])), poll_seconds=3600)")
    server = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(config)],
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_RUNNER_POLL_FREQUENCY": "1"})
    try:
        nightly = wait_for(lambda: _deployment_with_trigger(client), "the served deployment and its trigger", 180,
                           process=server)
        emit_event(EVENT, resource=source_resource(source), payload={"source": source, "new_files": 3})
        run = wait_for(lambda: _final_run(client, nightly.id), "train/nightly to run and finish", seconds=300)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)

    assert run.state.type.value == "COMPLETED", run.state.message
    assert run.parameters["source"] == source and run.parameters["root"] == root
    (report_uri,) = glob.glob(os.path.join(root, "runs", f"*-{run.name}", "report.json"))
    report = json.load(open(report_uri))
    assert report["status"] == "refused" and not report["blessed"] and report["pushed_version"] is None
    assert any("accuracy" in reason for reason in report["reasons"])
    (check,) = report["datacheck"]["spans"]  # checked by the run
    assert (check["span"], check["status"], check["label_check"]["status"]) == (2, "warning", "done")
    assert list(check["label_counts"]) == ["seven"] and Spans(root).unchecked() == []
    assert read_json(os.path.join(os.path.dirname(report_uri), "metrics.json"))["spans"] == [1, 2]
    assert Repository(root, "stoke").versions() == [pushed_run["summary"]["pushed_version"]]


def _deployment_with_trigger(client):
    try:
        deployment = client.read_deployment_by_name("train/nightly")
    except Exception:  # not registered yet
        return None
    return deployment if client.read_automations_by_name(TRIGGER) else None


def _final_run(client, deployment_id):
    runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    done = [r for r in runs if r.state and r.state.type.value in FINAL]
    return done[0] if done else None
