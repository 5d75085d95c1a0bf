"""The `watch-bucket` flow: one `stoke.data.arrived` event when new files have landed and settled.

    list SOURCE - what the published spans' manifests hold  = new files
    wait settle_seconds, list again                        -> still changing? wait for the next poll
    a train run for this SOURCE already queued or running?  -> it (or the next poll) picks them up
    emit stoke.data.arrived {source, new_files}            -> train/nightly runs (deployment trigger)

No state of its own beyond the manifests, so a restarted watcher behaves the same: the listing is
compared with what ingest has published, "settled" means two listings a few seconds apart agree, and
"already asked" is read from the orchestrator's own queue of train runs. A burst of ten thousand
uploads therefore asks for one run: every poll during the burst sees the listing move, and every
poll after the first event sees that run waiting or running.
"""
from __future__ import annotations

import time

from prefect import flow, get_run_logger, task
from prefect.events import emit_event
from prefect.states import Failed

from beam_jobs.sources import identities, known, list_source
from components.contracts.layout import Root
from components.contracts.program import escape_logs
from components.contracts.results import ResultError
from flows.parameters import DEMO_ROOT, DEMO_SOURCE

escape_logs("prefect.flow_runs", "prefect.task_runs")  # bucket and file names in every message

EVENT = "stoke.data.arrived"
TRAIN_FLOW = "train"


@flow(name="watch-bucket", description="emit stoke.data.arrived when new files in SOURCE have settled")
def watch_bucket(source: str = DEMO_SOURCE, root: str = DEMO_ROOT, settle_seconds: float = 15.0) -> dict:
    """Lists SOURCE twice, `settle_seconds` apart, and asks for one training run when new files have settled."""
    logger = get_run_logger()
    try:
        first = new_files(source, root)
    except ResultError as error:  # a broken span manifest: every stage would stop on it, so say which
        logger.error("%s", error)
        return Failed(message=str(error))
    if not first:
        return {"source": source, "new_files": 0, "emitted": False, "reason": "nothing new"}
    time.sleep(settle_seconds)
    try:
        second = new_files(source, root)
    except ResultError as error:
        return Failed(message=str(error))
    if second != first:
        logger.info("%d new files, but the listing is still changing; waiting for the next poll", len(second))
        return {"source": source, "new_files": len(second), "emitted": False, "reason": "still changing"}
    pending = train_runs_in_flight(source)
    if pending:
        logger.info("%d new files; train run %s is already queued or running for %s", len(second), pending[0], source)
        return {"source": source, "new_files": len(second), "emitted": False,
                "reason": f"train run {pending[0]} is already queued or running"}
    event = emit_event(EVENT, resource=source_resource(source), payload={"source": source, "new_files": len(second)})
    logger.info("%d new files in %s: emitted %s", len(second), source, EVENT)
    return {"source": source, "new_files": len(second), "emitted": True,
            "event_id": str(event.id) if event else None}


@task(retries=3, retry_delay_seconds=[5, 15, 45], retry_condition_fn=lambda task, run, state: not _broken(state))
def new_files(source: str, root: str) -> list[str]:
    """URIs in SOURCE (with size and version) that no published span holds yet."""
    published = identities(Root(root).manifests(quarantined=True))
    listing = list_source(source, eval_fraction=0.0)
    fresh = [s for s in listing.sources + [r for r, _ in listing.rejected] if known(s) not in published]
    return sorted(f"{s.uri}\t{s.size}\t{s.version}" for s in fresh)


@task(retries=2, retry_delay_seconds=5)
def train_runs_in_flight(source: str) -> list[str]:
    """Names of `train` runs for SOURCE that are running, or waiting to start now (not future schedules)."""
    from datetime import UTC, datetime

    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    active = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED, StateType.CANCELLING]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[TRAIN_FLOW])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=active))))
    now = datetime.now(UTC)
    return [run.name for run in runs
            if run.parameters.get("source", source) == source
            and not (run.state_type == StateType.SCHEDULED and run.expected_start_time
                     and run.expected_start_time > now)]


def _broken(state) -> bool:
    """A broken span manifest: retrying cannot mend the file."""
    try:
        state.result()
    except ResultError:
        return True
    except Exception:
        return False
    return False


def source_resource(source: str) -> dict[str, str]:
    return {"prefect.resource.id": f"stoke.source.{source}", "prefect.resource.name": source}
