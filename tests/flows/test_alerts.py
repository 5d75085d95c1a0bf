"""Alerts: a train/nightly run that fails or crashes, and runs in a row that push no model, reach a webhook
(an http.server on 127.0.0.1) through the block and automations `stoke up` and `stoke deploy` register on the
session's Prefect test server; the webhook's URL, a secret, stays out of every record and line."""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest
from prefect import get_client
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed

from components.common.files import read_json, write_json
from components.contracts.layout import new_run_id
from components.contracts.run_config import RunConfig
from flows import alerts, work_pools
from flows.alerts import BLOCK, failure_words, in_a_row, row_words
from flows.deployments import NIGHTLY
from tests.credentials import PASSWORD, TOKEN, USER, holding, shows
from tests.flows.conftest import TINY_BEAM, copy_of
from tests.waiting import wait_for, web_server

AUTOMATIONS = [f"stoke: {NIGHTLY} alerts", f"stoke: {NIGHTLY} crashed"]
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@contextmanager
def webhook():
    """A webhook on 127.0.0.1 whose path holds a token, as a chat's does; yields its URL and the JSON bodies
    POSTed to it, in order."""
    received = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    with web_server(Hook) as port:
        yield f"http://127.0.0.1:{port}/hooks/T0/B0/{TOKEN}", received


@pytest.fixture
def client():
    with get_client(sync_client=True) as client:
        yield client
        for name in ("train/nightly", "watch-bucket/poll"):  # left behind, they would answer other tests' events
            try:
                client.delete_deployment(client.read_deployment_by_name(name).id)
            except Exception:  # not created by this test
                pass
        alerts.register(RunConfig(root="/r"), NIGHTLY)  # no webhook: the automations and the block go


# ---------------------------------------------------------------- the row, and the words


def run_folder(root, run_id: str, started: int, status: str | None, model_name: str = "stoke") -> None:
    """A run folder as a run leaves it: config.json first, report.json last (none: a run under way or killed)."""
    write_json(os.path.join(root, "runs", run_id, "config.json"), {"model_name": model_name})
    os.utime(os.path.join(root, "runs", run_id, "config.json"), (started, started))
    if status is not None:
        write_json(os.path.join(root, "runs", run_id, "report.json"),
                   {"run_id": run_id, "status": status, "config": {"model_name": model_name}})


def test_a_row_is_counted_from_the_reports_newest_first(tmp_path):
    root = str(tmp_path)
    for started, (run_id, status, *model) in enumerate([
            ("a-pushed", "pushed"), ("b-skipped", "skipped"), ("c-failed", "failed"), ("d-refused", "refused"),
            ("e-killed", None), ("f-other-model", "pushed", "other"), ("g-skipped", "skipped")]):
        run_folder(root, run_id, 1_000_000 + started * 100, status, *model)
    assert in_a_row(root, "stoke") == 3  # g, d, b: a failed run, one without a report and another model's pass
    assert in_a_row(root, "other") == 0  # its newest, f, pushed
    run_folder(root, "h-trained", 1_000_700, "trained")
    assert in_a_row(root, "stoke") == 0  # trained, not refused or skipped: the row ended
    run_folder(root, "i-refused", 1_000_800, "refused")
    (tmp_path / "runs" / "h-trained" / "report.json").write_text("{not json")
    assert in_a_row(root, "stoke") == 4  # an unreadable report is passed over, not taken for the row's end
    assert in_a_row(str(tmp_path / "nothing-yet"), "stoke") == 0


def test_the_order_is_when_each_run_began_not_its_name(tmp_path):
    root = str(tmp_path)
    run_folder(root, "z-skipped", 1_000_000, "skipped")  # by hand, named out of order: it began first
    run_folder(root, "a-pushed", 1_000_100, "pushed")
    run_folder(root, "b-skipped", 1_000_200, "skipped")
    assert in_a_row(root, "stoke") == 1


CREDENTIALED = [f"https://{USER}:{PASSWORD}@photos.example/in", f"s3://photos/in?X-Amz-Signature={TOKEN}",
                f"gs://photos/in?token={TOKEN}&x=1"]


@pytest.mark.parametrize("where", CREDENTIALED)
def test_the_words_name_the_run_its_report_and_reason_without_credentials_or_escapes(where):
    summary = {"run_id": "run-1", "status": "skipped", "report_md": "/root/runs/run-1/report.md",
               "message": f"Nothing to do: no span under {where} \x1b[31mnew\x1b[0m"}
    subject, message = row_words(NIGHTLY, "stoke", summary, 3)
    assert subject == "Stoke train/nightly: 3 runs in a row pushed no model"
    first, second, third = message.split("\n")
    assert first.startswith("Run run-1 of train/nightly was skipped: Nothing to do: no span under ")
    assert second == "That makes 3 runs in a row of model stoke that pushed no model (refused or skipped)."
    assert third == "Report: /root/runs/run-1/report.md"
    assert not shows(subject + message) and "\x1b" not in message and "\\x1b[31m" in message

    reason = f"ingest: cannot read {where}\nline two"
    subject, message = failure_words(NIGHTLY, "run-2", "brave-fox", "Failed", reason, "/root/runs/run-2/report.md")
    assert subject == "Stoke train/nightly: run run-2 failed"
    assert message.split("\n")[1:] == ["Report: /root/runs/run-2/report.md"]  # the reason's own line break escaped
    assert message.startswith("Run run-2 of train/nightly (flow run brave-fox) failed: ingest: cannot read ")
    assert not shows(subject + message)


def test_a_run_that_made_no_run_folder_or_timed_out_says_so():
    subject, message = failure_words(NIGHTLY, "../x", "calm-owl", "TimedOut", "bad run id '../x'", None)
    assert subject == "Stoke train/nightly: run ../x timed out"
    assert message.endswith("It wrote no report: it stopped before its run folder was made.")


# ---------------------------------------------------------------- what `stoke deploy` registers


def test_deploy_registers_the_alerts_once_updates_them_and_removes_them(client, tmp_path):
    pool = work_pools.WorkPool(type="process", name="stoke-alerts-test")
    source, root = str(tmp_path / "in"), str(tmp_path / "root")
    with webhook() as (url, received):
        for after in (3, 5):  # twice: updated in place, never doubled
            config = RunConfig(source=source, root=root, alerts={"webhook": url, "after": after})
            work_pools.deploy(config, pool)
        found = [client.read_automations_by_name(name) for name in AUTOMATIONS]
        assert [len(each) for each in found] == [1, 1]
        (said,), (crashed,) = found
        assert said.trigger.expect == {"stoke.run.failed", "stoke.run.refused", "stoke.run.skipped"}
        assert said.trigger.match.model_dump() == {"prefect.resource.id": "stoke.run.*", "stoke.deployment": NIGHTLY}
        block = client.read_block_document_by_name(BLOCK, "custom-webhook", include_secrets=False)  # as the UI reads it
        assert said.actions[0].block_document_id == crashed.actions[0].block_document_id == block.id
        assert not shows(json.dumps(block.data, default=str)) and not shows(json.dumps([a.model_dump(mode="json")
                                                                                       for a in (said, crashed)]))
        nightly = client.read_deployment_by_name(NIGHTLY)
        assert nightly.parameters["alerts"] == {"after": 5} and not shows(json.dumps(nightly.parameters))
        said_by_deploy = alerts.described(config, NIGHTLY)  # `stoke deploy` prints it, `stoke up`'s banner too
        assert said_by_deploy.endswith(f" go to {url.split('/hooks/')[0]}/...") and not shows(said_by_deploy)

        # A run killed outright says nothing itself: Prefect's record of its crash is sent.
        run = client.create_flow_run_from_deployment(nightly.id)
        client.set_flow_run_state(run.id, Crashed(message="Flow run infrastructure exited with non-zero status code -9."),
                                  force=True)
        (sent,) = wait_for(lambda: received, "the crash to reach the webhook", 60)
    subject, *lines = sent["text"].split("\n")
    assert subject == "Stoke train/nightly: a run crashed"
    assert lines == [f"Flow run {run.name} of train/nightly crashed: Flow run infrastructure exited with non-zero "
                     "status code -9.", f"It wrote no report; its run folder, if it got that far: {root}/runs/run-*-{run.name}"]

    work_pools.deploy(RunConfig(source=source, root=root), pool)  # alerts.webhook removed: so are they
    assert [client.read_automations_by_name(name) for name in AUTOMATIONS] == [[], []]
    from prefect.exceptions import ObjectNotFound

    with pytest.raises(ObjectNotFound):
        client.read_block_document_by_name(BLOCK, "custom-webhook")
    client.delete_work_pool(pool.name)


# ---------------------------------------------------------------- served runs, end to end


def test_a_served_nightly_that_fails_then_skips_twice_in_a_row_reaches_the_webhook(client, pushed_run, tmp_path):
    """train/nightly served as `stoke up` serves it, on a copy of the served ROOT: nothing is new, so its runs
    skip training in seconds. Skipped; failed on a setting Prefect refuses (before the run has a folder); failed
    on SOURCE unreadable (with a report); skipped. Each failure is sent at once, and the last run is the second
    in a row to push no model (the failures passed over): with alerts.after 2, sent too."""
    source, root = copy_of(pushed_run, tmp_path)
    with webhook() as (url, received):
        config = {"source": source, "root": root, "preflight": None, "preset": "demo", "beam_args": TINY_BEAM,
                  "alerts": {"webhook": url, "after": 2}}
        code = ("import json, sys; from flows.deployments import serve_deployments; "
                "from components.contracts.run_config import RunConfig; "
                "serve_deployments(RunConfig.model_validate(json.loads(sys.argv[1])), poll_seconds=3600)")
        server = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(config)],
            env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_RUNNER_POLL_FREQUENCY": "1"})
        try:
            nightly = wait_for(lambda: _served(client), "the served deployment and its alerts", 180, process=server)
            first = _run(client, nightly.id, {})
            # Prefect's parameter schema lets it through (each number is fine alone); the flow refuses it.
            bad_setting = _run(client, nightly.id, {"runs": {"keep": 5, "keep_records": 2}})
            wait_for(lambda: received, "the refused setting to reach the webhook", 60)
            unreadable = _run(client, nightly.id, {"source": str(tmp_path / "nowhere")})
            wait_for(lambda: len(received) == 2, "the unreadable SOURCE to reach the webhook", 60)
            last = _run(client, nightly.id, {})
            wait_for(lambda: len(received) == 3, "the second skipped run in a row to reach the webhook", 60)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)

    runs = (first, bad_setting, unreadable, last)
    assert [r.state.type.value for r in runs] == ["COMPLETED", "FAILED", "FAILED", "COMPLETED"]
    setting, source_failure, row = [sent["text"].split("\n") for sent in received]  # the first run sent nothing
    run_id = new_run_id(bad_setting.expected_start_time, bad_setting.name)
    assert setting[0] == f"Stoke train/nightly: run {run_id} failed" and not os.path.exists(f"{root}/runs/{run_id}")
    assert setting[1].startswith(f"Run {run_id} of train/nightly (flow run {bad_setting.name}) failed: ")
    assert "keep_records (2) must be at least keep (5)" in setting[1]
    assert setting[2] == "It wrote no report: it stopped before its run folder was made."
    run_id = _run_id(root, unreadable.name)
    assert source_failure[0] == f"Stoke train/nightly: run {run_id} failed"
    assert source_failure[1].startswith(f"Run {run_id} of train/nightly (flow run {unreadable.name}) failed: ingest: ")
    assert "nowhere" in source_failure[1] and source_failure[2] == f"Report: {root}/runs/{run_id}/report.md"
    assert read_json(f"{root}/runs/{run_id}/report.json")["status"] == "failed"
    run_id = _run_id(root, last.name)
    assert row[0] == "Stoke train/nightly: 2 runs in a row pushed no model"
    assert row[1].startswith(f"Run {run_id} of train/nightly was skipped: Nothing to do: nothing new to train on")
    assert row[2:] == ["That makes 2 runs in a row of model stoke that pushed no model (refused or skipped).",
                       f"Report: {root}/runs/{run_id}/report.md"]
    assert holding(root) == []  # the webhook's token: in no config.json, report or log under ROOT
    assert not shows(json.dumps([r.parameters for r in runs]))


def _served(client):
    try:
        deployment = client.read_deployment_by_name(NIGHTLY)
    except Exception:  # not registered yet
        return None
    return deployment if all(client.read_automations_by_name(name) for name in AUTOMATIONS) else None


def _run(client, deployment_id, parameters: dict):
    """A run of the deployment, started by hand, once it has ended."""
    started = client.create_flow_run_from_deployment(deployment_id, parameters=parameters)

    def ended():
        run = client.read_flow_run(started.id)
        return run if run.state and run.state.type.value in FINAL else None

    return wait_for(ended, f"flow run {started.name} to end", 300)


def _run_id(root: str, flow_run_name: str) -> str:
    (run_id,) = [name for name in os.listdir(os.path.join(root, "runs")) if name.endswith(f"-{flow_run_name}")]
    return run_id
