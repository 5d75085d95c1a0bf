"""The deployments, served from code (no prefect.yaml): `stoke up` serves them next to its server.

    train/nightly       the `train` flow at 02:00 (cron, timezone configurable), and whenever a
                        `stoke.data.arrived` event names a source (that source becomes the run's
                        `source` parameter); one run at a time, later ones wait in line (ENQUEUE)
    watch-bucket/poll   the `watch-bucket` flow every --poll-seconds; a poll still running when the
                        next is due makes the next one a no-op (CANCEL_NEW): polls never pile up.
                        With --notifications each run reads the queue instead of listing SOURCE, and
                        the train run an event asks for ingests only the files it names; the nightly
                        run still lists everything, the reconcile that catches a lost notification

A train/nightly run that fails or crashes, or the `alerts.after`-th in a row to push no model, is sent to
`alerts.webhook` by automations registered beside the deployments (flows/alerts.py).

Their parameters are the run configuration `stoke up` or `stoke deploy` was given (--config, --set,
--preset), as far as it differs from the defaults, never alerts.webhook (a secret, which pydantic leaves
out of every dump), and SOURCE without its credentials: a flow run takes SOURCE itself from STOKE_SOURCE
in its environment (`stoke up` sets it for the runs it serves; a worker's flow runs get it as they get
bucket credentials, flows/work_pools.py); and `networks`, the networks of code (--network) a run may
choose beside train.network.
`prefect deployment run train/nightly` starts a run by hand; `-p train='{"epochs": 20}'` and the like
lay settings over the deployment's, group by group; `-p train='{"network": ...}'` names a built-in
network or one the deployment lists (flows/parameters.py check_network_choice).
"""
from __future__ import annotations

import os
import signal

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.events import DeploymentEventTrigger
from prefect.schedules import Cron, Interval

from components.contracts.run_config import RunConfig
from components.contracts.secrets import recorded
from flows.alerts import register
from flows.pipeline import pipeline
from flows.run_options import given_fields
from flows.watch_bucket import EVENT, watch_bucket

NIGHTLY_CRON = "0 2 * * *"
NIGHTLY = f"{pipeline.name}/nightly"  # the deployment the schedule runs, and whose runs alert (flows/alerts.py)
# The files an event names, one a line, for the train run it triggers; "" (list all of SOURCE) when it
# names none, as a poll's events and an event over watch_bucket.NAMED_LIMIT files do.
ARRIVED = "{{ event.payload.files | default([]) | join('\\n') }}"


def build_deployments(config: RunConfig, *, poll_seconds: float = 60, cron: str = NIGHTLY_CRON,
                      timezone: str = "UTC", notifications: str | None = None,
                      networks: list[str] = ()) -> list[RunnerDeployment]:
    """train/nightly, with `config` as its parameters, and watch-bucket/poll of its SOURCE; with
    `notifications` (sqs://QUEUE, pubsub://projects/P/subscriptions/S) the watcher reads that queue. A run of
    train/nightly may choose its network among `networks` too (network references, located)."""
    config = config.model_copy(update={"source": recorded(config.source)})
    nightly = pipeline.to_deployment(
        name=NIGHTLY.split("/")[1],
        schedules=[Cron(cron, timezone=timezone)],
        triggers=[DeploymentEventTrigger(
            name="train when data arrives",
            expect={EVENT},
            match={"prefect.resource.id": "stoke.source.*"},
            parameters={"source": "{{ event.payload.source }}", "arrived": ARRIVED},
        )],
        parameters=nightly_parameters(config, networks),
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
        tags=["stoke"],
        # Importable by module name from anywhere the project is installed, not by a file path
        # relative to wherever `stoke up` happened to start.
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    poll = watch_bucket.to_deployment(
        name="poll",
        schedules=[Interval(poll_seconds)],
        parameters={"source": config.source, "root": config.root, "settle_seconds": settle_seconds(poll_seconds),
                    **({"notifications": notifications, "wait_seconds": wait_seconds(poll_seconds)}
                       if notifications else {})},
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
        tags=["stoke"],
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    return [nightly, poll]


def nightly_parameters(config: RunConfig, networks: list[str] = ()) -> dict:
    """What the configuration sets; the scheduled and data-triggered runs skip training when nothing is
    new and a model is served; the networks a run may choose, when any are listed."""
    return {**given_fields(config), "skip_unchanged": True, **({"networks": list(networks)} if networks else {})}


def settle_seconds(poll_seconds: float) -> float:
    """How long a listing must stay the same: a quarter of the poll, between 1 s and 30 s."""
    return min(max(poll_seconds / 4, 1.0), 30.0)


def wait_seconds(poll_seconds: float) -> float:
    """How long one run waits for a first notification: half the poll, at most SQS's 20 s long poll."""
    return min(max(poll_seconds / 2, 1.0), 20.0)


def serve_deployments(config: RunConfig, **options) -> None:
    """Registers the deployments and their alerts, and runs their flow runs here until Ctrl-C or SIGTERM
    (blocking)."""
    register(config, NIGHTLY)
    # Ctrl-C takes the path of SIGTERM (`docker stop`, systemd), on which Prefect's runner shuts down
    # cleanly; under asyncio's own Ctrl-C handling its shutdown can wait forever.
    previous = signal.signal(signal.SIGINT, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))
    try:
        # Schedules stay active across a restart of `stoke up`: a paused nightly would go unnoticed.
        serve(*build_deployments(config, **options), pause_on_shutdown=False, print_starting_message=False)
    finally:
        signal.signal(signal.SIGINT, previous)
