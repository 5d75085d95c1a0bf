"""The `watch-bucket` flow: one `stoke.data.arrived` event when new files have landed and settled.

Polling (the default; also the fallback and, through the nightly run's full listing, the reconcile):

    list SOURCE - what the published spans hold             = new files (streamed against
                                                              each span's sorted source index)
    wait settle_seconds, list again                        -> still changing? wait for the next poll
    a train run for this SOURCE already queued or running?  -> it (or the next poll) picks them up
    emit stoke.data.arrived {source, new_files}            -> train/nightly runs (deployment trigger)

No state of its own beyond the manifests, so a restarted watcher behaves the same: the listing is
compared with what ingest has published, "settled" means two listings a few seconds apart agree, and
"already asked" is read from the orchestrator's own queue of train runs. A burst of ten thousand
uploads therefore asks for one run: every poll during the burst sees the listing move, and every
poll after the first event sees that run waiting or running.

With `notifications` (sqs://QUEUE or pubsub://projects/P/subscriptions/S) the bucket announces its
new objects instead, and nothing is listed:

    collect messages until the queue is quiet for settle_seconds  (one batch per burst)
    keep the objects under SOURCE that exist and no published span holds
    emit stoke.data.arrived {source, new_files, files}      -> train/nightly ingests only `files`
    delete (SQS) or acknowledge (Pub/Sub) the messages        only now: a crash before this
                                                              redelivers them, and ingest, being
                                                              exactly-once, publishes nothing twice

Each record of an S3 event is judged alone: one that names no created object (S3's test event, a
deletion, garbage) is left out and the rest of its message kept; the poll logs one line for all it
left out, and those messages are deleted with the rest. Prefect's emit_event reports a failure by
returning None (it logs why): then nothing is deleted, the run fails, and the queue hands the
messages out again. A lost notification delays data until the nightly run, whose ingest lists all
of SOURCE; it never loses it.
"""
from __future__ import annotations

import time

from prefect import flow, get_run_logger, task
from prefect.events import emit_event
from prefect.states import Failed

from beam_jobs.compare import compare
from beam_jobs.sources import each_listed, list_named
from components.common.program import escape_logs, printable
from components.contracts.layout import Root
from components.contracts.results import ResultError
from components.contracts.secrets import given
from flows import notifications as queues
from flows.console import quiet_console
from flows.parameters import DEMO_ROOT, DEMO_SOURCE

escape_logs("prefect.flow_runs", "prefect.task_runs")  # bucket and file names in every message
quiet_console("watch-bucket")  # one line a poll on the terminal; the run's log keeps the engine's lines

EVENT = "stoke.data.arrived"
TRAIN_FLOW = "train"
BATCH_LIMIT = 10_000  # messages per window: a bigger burst is several events, each well within its size
NAMED_LIMIT = 1_000  # files an event names; beyond that it names none and ingest lists all of SOURCE


@flow(name="watch-bucket", description="emit stoke.data.arrived when new files in SOURCE have settled")
def watch_bucket(source: str = DEMO_SOURCE, root: str = DEMO_ROOT, settle_seconds: float = 15.0,
                 notifications: str | None = None, wait_seconds: float = 20.0) -> dict:
    """Lists SOURCE twice, `settle_seconds` apart, and asks for one training run when new files have settled;
    with `notifications`, reads the queue for up to `wait_seconds` instead of listing. SOURCE is the
    deployment's, without its credentials: the listing takes them from STOKE_SOURCE, events never hold them."""
    logger = get_run_logger()
    try:
        given(source)
    except ValueError as error:  # its password is not here: every listing would be refused
        logger.error("%s", error)
        return Failed(message=printable(str(error)))
    if notifications:
        try:
            return watch_queue(source, root, queues.open_queue(notifications), settle_seconds, wait_seconds)
        except (queues.NotificationError, ResultError) as error:
            logger.error("%s", error)
            return Failed(message=printable(str(error)))
    try:
        first = new_files(source, root)
    except ResultError as error:  # a broken span manifest: every stage would stop on it, so say which
        logger.error("%s", error)
        return Failed(message=printable(str(error)))
    if not first:
        logger.info("nothing new in %s", source)
        return {"source": source, "new_files": 0, "emitted": False, "reason": "nothing new"}
    time.sleep(settle_seconds)
    try:
        second = new_files(source, root)
    except ResultError as error:
        return Failed(message=printable(str(error)))
    if second != first:
        logger.info("%d new files, but the listing is still changing; waiting for the next poll", len(second))
        return {"source": source, "new_files": len(second), "emitted": False, "reason": "still changing"}
    pending = train_runs_in_flight(source)
    if pending:
        logger.info("%d new files; train run %s is already queued or running for %s", len(second), pending[0], source)
        return {"source": source, "new_files": len(second), "emitted": False,
                "reason": f"train run {pending[0]} is already queued or running"}
    event = emit_event(EVENT, resource=source_resource(source), payload={"source": source, "new_files": len(second)})
    if event is None:
        return not_emitted(f"{len(second)} new files in {source}, but {EVENT} could not be emitted; the next poll "
                           "asks again")
    logger.info("%d new files in %s: emitted %s", len(second), source, EVENT)
    return {"source": source, "new_files": len(second), "emitted": True, "event_id": str(event.id)}


@task(retries=3, retry_delay_seconds=[5, 15, 45], retry_condition_fn=lambda task, run, state: not _broken(state))
def new_files(source: str, root: str) -> list[str]:
    """URIs in SOURCE (with size and version) that no published span holds yet."""
    found = compare(each_listed(given(source), eval_fraction=0.0), Root(root))
    return sorted(f"{s.uri}\t{s.size}\t{s.version}" for s in found.fresh + [r for r, _ in found.refused])


def watch_queue(source: str, root: str, queue, settle_seconds: float, wait_seconds: float) -> dict:
    """One batch of notifications: an event naming the new files, then the messages deleted."""
    logger = get_run_logger()
    messages = queues.collect(queue, wait_seconds, settle_seconds, BATCH_LIMIT)
    named, dropped = set(), []
    for message in messages:
        announced = queues.created(message)
        named.update(announced.uris)
        dropped += [f"message {message.id}: {why}" for why in announced.dropped]
    if dropped:  # one line for the poll, however many there are
        logger.warning("dropped %d notification records from %s that name no created object: %s%s", len(dropped),
                       queue.name, "; ".join(dropped[:3]), f"; and {len(dropped) - 3} more" if len(dropped) > 3 else "")
    fresh = named_new_files(source, root, sorted(named))
    result = {"source": source, "messages": len(messages), "new_files": len(fresh), "emitted": False}
    if fresh:
        payload = {"source": source, "new_files": len(fresh)}
        if len(fresh) <= NAMED_LIMIT:
            payload["files"] = fresh
        event = emit_event(EVENT, resource=source_resource(source), payload=payload)
        if event is None:  # not emitted: the messages stay, so the queue hands them out again
            return not_emitted(f"{len(fresh)} new files in {source} announced by {queue.name}, but {EVENT} could not "
                               f"be emitted; its {len(messages)} messages stay in the queue and come back")
        logger.info("%d new files in %s announced by %s: emitted %s", len(fresh), source, queue.name, EVENT)
        result.update(emitted=True, event_id=str(event.id))
    elif messages:
        result["reason"] = "nothing new"
    else:
        result["reason"] = "no notifications"
    failed = queue.done(messages)  # only after the event: a crash before here redelivers them
    if failed:
        logger.warning("%d messages were not deleted and will come back (harmless): %s", len(failed), failed[:3])
    return result


def not_emitted(message: str):
    """The poll's failure when Prefect could not emit the event (emit_event returned None, having logged why)."""
    get_run_logger().error("%s", message)
    return Failed(message=printable(message))


def named_new_files(source: str, root: str, uris: list[str]) -> list[str]:
    """The announced URIs that are files of SOURCE now, in no published span yet; others logged."""
    logger = get_run_logger()
    listing = list_named(given(source), uris)
    for uri, why in listing.skipped:
        logger.warning("ignored %s: %s", uri, why)
    found = compare(listing.entries(), Root(root))
    return sorted({s.uri for s in found.fresh + [r for r, _ in found.refused]})


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
