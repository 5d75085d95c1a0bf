"""Runs that died without a word, said to have crashed by the next run of their ROOT.

A `stoke run` killed outright (SIGKILL, the OOM killer, a machine lost) cannot tell Prefect, and Prefect hears
of a crash only from the process that ran the flow or from the worker that started it: the flow run stays
Running for ever, and the deployment's crash alert (flows/alerts.py) never goes out. So each run of the `train`
flow holds a lease of its own while it runs, ROOT/runs/.running/<flow run id>.lock (an flock, or an object
renewed on a bucket: components/common/lease.py), and lets it go, removing it, as it ends. Before it takes
its own, a run looks at every flow run of the same ROOT that Prefect calls Running: one whose lease is there
but free is dead, and is said Crashed, which sends Prefect's `prefect.flow-run.Crashed` and the alert on it.

Fail closed, never calling a live run dead: a run is Running a moment before it takes its lease, so one that
started less than START_GRACE ago is left alone; it lets its lease go a moment before Prefect records its end,
so a dead-looking run is read again LOOK_AGAIN later and judged only if Prefect still calls it Running; and a
run without a lease (one from before Stoke held them, or of another machine's ROOT at the same path) is not
this run's to judge.
"""
from __future__ import annotations

import contextlib
import datetime
import posixpath
import time
import uuid
from collections.abc import Iterator

from prefect import get_client, get_run_logger
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Crashed

from components.common.files import filesystem
from components.common.lease import exclusive, held
from components.contracts.config import local_folder
from components.contracts.layout import Root

START_GRACE = 60.0  # seconds from Running to its lease, however busy the machine
LOOK_AGAIN = 5.0  # seconds from a free lease to the second reading of the run's state
TAKE_WAIT = 10.0  # seconds a run waits for its own lease while another run looks at it


def where(root: str) -> str:
    """ROOT as one spelling: two runs name one local ROOT by relative and absolute paths alike."""
    return local_folder(root) if root.startswith("file://") or "://" not in root else root.rstrip("/")


@contextlib.contextmanager
def running(root: str) -> Iterator[None]:
    """This flow run's lease on ROOT for the block, after saying Crashed for the runs of ROOT that died
    without a word (`said_crashed`). Outside a flow run (no Prefect id) there is nothing to hold."""
    this = flow_run.id
    if not this:
        yield
        return
    said_crashed(root, this, flow_run.name, get_run_logger())
    with exclusive(Root(root).running(this), f"flow run {flow_run.name}", wait=TAKE_WAIT, own=True):
        yield


def said_crashed(root: str, this: str, name: str, logger) -> list[str]:
    """Says Crashed for every flow run of `root` that Prefect calls Running and whose lease is free, as flow run
    `this` (named `name`) found them; returns their names. Best effort: Prefect or the store not answering
    leaves them for the next run, and `logger` says so."""
    try:
        with get_client(sync_client=True) as client:
            lost = [run for run in _running(client, root, this) if _dead(client, root, run)]
            for run in lost:
                client.set_flow_run_state(run.id, Crashed(message=(
                    f"its process ended without a word (killed outright: SIGKILL, the OOM killer or a machine "
                    f"lost); found by flow run {name} of the same ROOT")), force=True)
                logger.warning("flow run %s (run %s) of this ROOT died without a word: said Crashed", run.name,
                               run.parameters.get("run_id") or "named by its start")
            _sweep(client, root)
    except Exception as error:  # Prefect's API, the store, a lease written by hand: none may stop this run
        logger.warning("runs of this ROOT that died without a word are not looked for this time: %s", error)
        return []
    return [run.name for run in lost]


def _running(client, root: str, this: str) -> list:
    """The `train` flow's runs of `root` that Prefect calls Running, other than this one, started long enough
    ago to hold their lease."""
    runs = client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=["train"])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
    now = datetime.datetime.now(datetime.UTC)
    return [run for run in runs if str(run.id) != str(this) and isinstance(run.parameters.get("root"), str)
            and where(run.parameters["root"]) == where(root) and run.start_time is not None
            and (now - run.start_time).total_seconds() > START_GRACE]


def _dead(client, root: str, run) -> bool:
    """Its lease is there and free, and Prefect still calls it Running a moment later."""
    if held(Root(root).running(str(run.id))) is not False:
        return False
    time.sleep(LOOK_AGAIN)
    return client.read_flow_run(run.id).state_type == StateType.RUNNING


def _sweep(client, root: str) -> None:
    """Removes the leases of dead runs that Prefect no longer calls Running (said Crashed above, or by the worker
    that saw its process die): free, they are nobody's, and nothing else would remove them."""
    fs, folder = filesystem(Root(root).running_leases)
    for path in fs.ls(folder, detail=False) if fs.isdir(folder) else []:
        try:  # a name read from ROOT is data: a Prefect id, or no lease of a run
            flow_run_id = str(uuid.UUID(posixpath.basename(path).removesuffix(".lock")))
        except ValueError:
            continue
        try:
            running = client.read_flow_run(flow_run_id).state_type == StateType.RUNNING
        except ObjectNotFound:  # a run of another Prefect server, or one whose record was deleted
            running = False
        if not running and held(Root(root).running(flow_run_id)) is False:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(path)
