"""A run of ROOT says Crashed for the runs of ROOT that died without a word, and for no other."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import pytest
from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed, Running

from components.common.lease import exclusive, held
from components.contracts.layout import Root
from flows import lost_runs
from flows.pipeline import pipeline
from tests.flows.conftest import TINY_BEAM
from tests.waiting import wait_for

LOG = logging.getLogger("test")


@pytest.fixture
def client():
    with get_client(sync_client=True) as client:
        yield client


@pytest.fixture
def at_once(monkeypatch):
    """Runs started a moment ago count as old enough, and a free lease is read once: the test's runs are new."""
    monkeypatch.setattr(lost_runs, "START_GRACE", 0.0)
    monkeypatch.setattr(lost_runs, "LOOK_AGAIN", 0.0)


def running_run(client, root: str, lease: str | None = "free"):
    """A flow run of the `train` flow of `root` that Prefect calls Running, with its lease as `lease` says:
    "free" (its holder died), "held" (returned open: the caller lets it go), or None (no lease)."""
    run = client.create_flow_run(pipeline, parameters={"root": root, "source": "/in"}, state=Running())
    holder = None
    if lease is not None:
        holder = exclusive(Root(root).running(str(run.id)), "a run of the test")
        holder.__enter__()
        if lease == "free":
            holder.__exit__(None, None, None)
            holder = None
    return run, holder


def state(client, run) -> StateType:
    return client.read_flow_run(run.id).state_type


def test_only_a_run_of_this_root_whose_lease_is_free_is_said_crashed(client, at_once, tmp_path, monkeypatch):
    root, other_root = str(tmp_path / "root"), str(tmp_path / "other")
    monkeypatch.chdir(tmp_path)
    dead, _ = running_run(client, root)
    dead_spelled_relative, _ = running_run(client, "root/")
    alive, holder = running_run(client, root, "held")
    unleased, _ = running_run(client, root, None)  # from before runs held leases, or another machine's ROOT
    elsewhere, _ = running_run(client, other_root)
    this, _ = running_run(client, root, None)
    try:
        found = lost_runs.said_crashed(root, str(this.id), this.name, LOG)
        crashed = client.read_flow_run(dead.id).state
        assert sorted(found) == sorted([dead.name, dead_spelled_relative.name])
        assert crashed.type == StateType.CRASHED and "ended without a word" in crashed.message
        assert this.name in crashed.message
        assert [state(client, r) for r in (alive, unleased, elsewhere, this)] == [StateType.RUNNING] * 4
        assert held(Root(root).running(str(dead.id))) is None  # its lease gone with it
        assert lost_runs.said_crashed(root, str(this.id), this.name, LOG) == []  # said once
    finally:
        holder.__exit__(None, None, None)
    # Its holder gone while Prefect still calls it Running (read twice): the live run of a moment ago died.
    assert lost_runs.said_crashed(root, str(this.id), this.name, LOG) == [alive.name]


def test_the_lease_of_a_dead_run_goes_once_prefect_no_longer_calls_it_running(client, at_once, tmp_path):
    """A run a worker saw killed is Crashed already, its lease left behind: swept, as a run said Crashed here is.
    A lease held, one whose run Prefect still calls Running, and a name that is no Prefect id stay."""
    root = str(tmp_path / "root")
    seen_killed, _ = running_run(client, root)
    client.set_flow_run_state(seen_killed.id, Crashed(message="Flow run infrastructure exited with code -9."),
                              force=True)
    alive, holder = running_run(client, root, "held")
    stranger = os.path.join(Root(root).running_leases, "not-a-run.lock")
    open(stranger, "w").close()
    try:
        assert lost_runs.said_crashed(root, "another", "calm-owl", LOG) == []
        assert held(Root(root).running(str(seen_killed.id))) is None
        assert held(Root(root).running(str(alive.id))) is True and os.path.exists(stranger)
    finally:
        holder.__exit__(None, None, None)


def test_a_run_that_ends_between_two_looks_is_not_said_crashed(client, at_once, tmp_path, monkeypatch):
    """A run lets its lease go a moment before Prefect records its end: read again, it is over."""
    root = str(tmp_path / "root")
    ending, _ = running_run(client, root)
    from prefect.states import Completed

    monkeypatch.setattr(lost_runs.time, "sleep", lambda _: client.set_flow_run_state(ending.id, Completed()))
    assert lost_runs.said_crashed(root, "another", "calm-owl", LOG) == []
    assert state(client, ending) == StateType.COMPLETED


def test_a_run_younger_than_its_lease_is_left_alone(client, tmp_path):
    root = str(tmp_path / "root")
    young, _ = running_run(client, root)
    assert lost_runs.said_crashed(root, "another", "calm-owl", LOG) == []
    assert state(client, young) == StateType.RUNNING


def test_a_killed_stoke_run_is_said_crashed_by_the_next_run_of_its_root(client, at_once, tmp_path):
    """`stoke run` killed outright (SIGKILL: nothing of it can speak), then the next run of its ROOT."""
    source, root = tmp_path / "in", str(tmp_path / "root")
    (source / "cat").mkdir(parents=True)
    running = Root(root).runs + "/.running"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    with open(tmp_path / "run.log", "wb") as log:
        killed = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(source), "--root", root, "--preset",
                                   "demo", "--no-preflight", "--run-id", "killed", "--set", f"beam_args={json.dumps(TINY_BEAM)}"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: os.path.isdir(running) and os.listdir(running), "the run to take its lease", 120,
                     process=killed)
        finally:
            os.killpg(killed.pid, signal.SIGKILL)
            killed.wait()
    (flow_run_id,) = [name.removesuffix(".lock") for name in os.listdir(running)]
    assert client.read_flow_run(flow_run_id).state_type == StateType.RUNNING  # nobody told Prefect

    # The next run (a folder with no image: it has nothing to train, and what matters here comes first).
    pipeline(source=str(source), root=root, preset="demo", preflight=None, beam_args=TINY_BEAM, run_id="next",
             return_state=True)
    crashed = client.read_flow_run(flow_run_id).state
    assert crashed.type == StateType.CRASHED and "ended without a word" in crashed.message
    assert os.listdir(running) == []  # the next run's lease went with it, and the dead one's with its verdict
