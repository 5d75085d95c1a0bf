"""Alerts: a train/nightly run that fails or crashes, and runs in a row that push no model, tell someone.

The `train` flow says what happened, as events naming the run, its report and the one-line reason, with
credentials hidden (the words are composed here, in Python, not in a template):

    stoke.run.failed    every failed run (the flow's on_failure hook): a stage's error, a setting refused
                        at run time, a timeout
    stoke.run.refused   a run the gate refused, or that skipped training (nothing new), when it is the
    stoke.run.skipped   `alerts.after`-th in a row of its model to push no model, and again at each further
                        `alerts.after`-th: counted from the reports in ROOT/runs, the newest first (`in_a_row`)

A run killed outright (the OOM killer, a lost node) says nothing itself: Prefect's own
`prefect.flow-run.Crashed` stands for it.

`stoke up` and `stoke deploy` register what sends them (`register`): a notification block, `stoke-alerts`
(Prefect's Custom Webhook, whose URL is one of its secrets: Prefect's API and UI show it as ***), and two
automations of train/nightly, one on the flow's events and one on its crashed flow runs. Registered by name:
registering again replaces them, and a configuration without `alerts.webhook` removes them and the block.

Why the flow counts: Prefect's triggers count events within a window of time, and "in a row" is a state of
the history (a pushed model ends a row however long ago it was); the run folders under ROOT are that
history, kept by their own rule (components/common/run_retention.py).
"""
from __future__ import annotations

import urllib.parse
from uuid import UUID

from prefect import get_client, get_run_logger
from prefect.events import emit_event
from prefect.runtime import deployment, flow_run

from components.common.files import exists, read_json
from components.common.program import printable
from components.common.run_retention import newest_first, survey
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig

EVENT = "stoke.run.{status}"  # failed, refused or skipped
COUNTED = ("refused", "skipped")  # what continues a row; a failed run is passed over, any other ends it
BLOCK = "stoke-alerts"
CRASHED = "prefect.flow-run.Crashed"
# What a crashed run's alert says, from Prefect's record of it: it wrote no report, and its run folder (run-<start>-<flow
# run name>, flows/pipeline.py flow_run_id) holds what it got to.
CRASH_MESSAGE = ("Flow run {{ flow_run.name }} of {name} crashed: {{ flow_run.state.message or flow_run.state.name }}\n"
                 "It wrote no report; its run folder, if it got that far: "
                 "{{ flow_run.parameters.root }}/runs/run-*-{{ flow_run.name }}")


# ---------------------------------------------------------------- what the flow says


def alert_if_due(config: RunConfig, summary: dict) -> dict:
    """The run's report summary, said as `stoke.run.refused` or `stoke.run.skipped` when the run, of a
    deployment, is the `alerts.after`-th in a row (or a multiple of it) of its model to push no model."""
    if deployment.id and summary["status"] in COUNTED:
        count = in_a_row(config.root, config.model_name)
        if count % config.alerts.after == 0:
            _emit(get_run_logger(), summary["status"], summary["run_id"],
                  *row_words(_where(), config.model_name, summary, count), report=summary["report_md"], in_a_row=count)
    return summary


def alert_failed(logger, root: str | None, run_id: str, reason: str, state: str) -> None:
    """A failed run of a deployment said as `stoke.run.failed`: its reason, and its report when the run got to
    write one (a run refused before its run folder was made has none). `logger`: the run's."""
    if deployment.id:
        report = _report(root, run_id)
        _emit(logger, "failed", run_id, *failure_words(_where(), run_id, flow_run.name, state, reason, report),
              report=report)


def row_words(where: str, model_name: str, summary: dict, count: int) -> tuple[str, str]:
    """The subject and message of the `count`-th run in a row that pushed no model, fit to show (no credentials,
    no control characters)."""
    return printable(f"Stoke {where}: {count} runs in a row pushed no model"), "\n".join(printable([
        f"Run {summary['run_id']} of {where} was {summary['status']}: {summary['message']}",
        f"That makes {count} runs in a row of model {model_name} that pushed no model (refused or skipped).",
        f"Report: {summary['report_md']}"]))


def failure_words(where: str, run_id: str, flow_run_name: str, state: str, reason: str,
                  report: str | None) -> tuple[str, str]:
    """The subject and message of a failed run (`state`: Failed, TimedOut...), fit to show."""
    what = {"TimedOut": "timed out"}.get(state, state.lower())
    return printable(f"Stoke {where}: run {run_id} {what}"), "\n".join(printable([
        f"Run {run_id} of {where} (flow run {flow_run_name}) {what}: {reason}",
        f"Report: {report}" if report else "It wrote no report: it stopped before its run folder was made."]))


def in_a_row(root: str, model_name: str) -> int:
    """How many of the newest runs of `model_name` into ROOT were refused or skipped, up to the newest that was
    neither (pushed, trained); failed runs, and folders without a readable report (a run under way or killed),
    are passed over."""
    count = 0
    for folder in newest_first(survey(Root(root))):
        if "report.json" not in folder.files:
            continue
        try:
            report = read_json(folder.run.report_json)
        except (OSError, ValueError):
            continue
        if not isinstance(report, dict) or (report.get("config") or {}).get("model_name") != model_name:
            continue
        if report.get("status") in COUNTED:
            count += 1
        elif report.get("status") != "failed":
            break
    return count


def _emit(logger, status: str, run_id: str, subject: str, message: str, **facts) -> None:
    """The event: its resource the run, labelled with the deployment the automation matches. Prefect's emit_event
    answers None when it could not emit: logged, never the run's failure."""
    event = emit_event(EVENT.format(status=status), resource={
        "prefect.resource.id": f"stoke.run.{run_id}", "prefect.resource.name": run_id, "stoke.deployment": _where()},
        payload={"run_id": run_id, "status": status, "subject": subject, "message": message, **facts})
    if event is None:
        logger.error("this alert could not be emitted: %s", subject)
    else:
        logger.info("alert emitted (%s): %s", event.event, subject)


def _where() -> str:
    """The running deployment, as `train/nightly`."""
    return f"{flow_run.flow_name}/{deployment.name}"


def _report(root: str | None, run_id: str) -> str | None:
    """The run's report.md when the run wrote its report, else None (no valid run folder, or none readable)."""
    try:
        run = Root(root).run(run_id)
        return run.report_md if exists(run.report_json) else None
    except (OSError, ValueError, TypeError):  # a ROOT or run id refused, a store that does not answer
        return None


# ---------------------------------------------------------------- what `stoke up` and `stoke deploy` register


def described(config: RunConfig, name: str) -> str:
    """What `register` makes of `config.alerts` for deployment `name` (flow/deployment), in one line."""
    if config.alerts.webhook is None:
        return f"No alerts: set alerts.webhook to hear of {name}'s failures (docs/orchestration.md, Alerts)"
    return (f"Alerts of {name} (failed or crashed runs, {config.alerts.after} in a row that push no model) go to "
            f"{shown(config.alerts.webhook.get_secret_value())}")


def register(config: RunConfig, name: str) -> None:
    """The block and the automations of deployment `name`'s alerts, as `config.alerts` says: made (in place of
    those of an earlier registration), or removed when it names no webhook."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        # Replaced, as Prefect replaces a deployment's triggers: its client's update sends only the fields set,
        # which the server refuses (a trigger's posture, an action's type left to their defaults).
        for automation in automations(name, UUID(int=0)):
            for found in client.read_automations_by_name(automation.name):
                client.delete_automation(found.id)
        if config.alerts.webhook is None:
            try:
                client.delete_block_document(client.read_block_document_by_name(BLOCK, "custom-webhook", False).id)
            except ObjectNotFound:
                pass
            return
        block = CustomWebhookNotificationBlock(
            name=f"Stoke {name}", url="{{webhook}}", secrets={"webhook": config.alerts.webhook.get_secret_value()},
            json_data={"text": "{{subject}}\n{{body}}"})
        for automation in automations(name, block.save(BLOCK, overwrite=True)):
            client.create_automation(automation)


def automations(name: str, block_id: UUID) -> list:
    """The automations of deployment `name` (flow/deployment), sending through block `block_id`: one on the flow's
    events, one on its crashed flow runs."""
    from prefect.automations import AutomationCore, EventTrigger, SendNotification

    flow_name, deployment_name = name.split("/")
    said = EventTrigger(expect={EVENT.format(status=status) for status in ("failed", *COUNTED)},
                        match={"prefect.resource.id": "stoke.run.*", "stoke.deployment": name})
    crashed = EventTrigger(expect={CRASHED}, match={"prefect.resource.id": "prefect.flow-run.*"}, match_related=[
        {"prefect.resource.role": "flow", "prefect.resource.name": flow_name},
        {"prefect.resource.role": "deployment", "prefect.resource.name": deployment_name}])
    return [
        AutomationCore(name=f"stoke: {name} alerts", trigger=said, actions=[SendNotification(
            block_document_id=block_id, subject="{{ event.payload.subject }}", body="{{ event.payload.message }}")],
            description=f"{name}: a failed run, and runs in a row that push no model (flows/alerts.py)"),
        AutomationCore(name=f"stoke: {name} crashed", trigger=crashed, actions=[SendNotification(
            block_document_id=block_id, subject=f"Stoke {name}: a run crashed", body=CRASH_MESSAGE.replace("{name}", name))],
            description=f"{name}: a flow run that crashed, which could not say so itself (flows/alerts.py)"),
    ]


def shown(url: str) -> str:
    """A webhook as Stoke shows it: scheme and host, never the path or query that hold its token."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/..."
