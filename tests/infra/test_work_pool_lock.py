"""A real process worker on a real Prefect server: a flow run created with job variables that
override the command or the environment runs as the deployment says, or not at all."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from components.common import processes
from flows import work_pools
from flows.parameters import check_job_variables
from flows.work_pools import WorkPool
from tests.infra.conftest import prefect_server
from tests.prefect_homes import migrated_home
from tests.waiting import free_port

BIN = os.path.dirname(sys.executable)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home, port = migrated_home(tmp_path_factory, tmp_path_factory.mktemp("prefect_home")), free_port()
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], "PREFECT_HOME": str(home),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PYTHONPATH": REPO}
    with prefect_server(env, home, port):
        yield env


DEPLOY = """
import sys
from prefect import flow
from flows import work_pools
pool = work_pools.WorkPool(type="process", name="locked")
work_pools.ensure_pool(pool, None, "--runner=DirectRunner")
flow.from_source(sys.argv[1], "tests/infra/probe_flow.py:probe").deploy(
    "probe", work_pool_name="locked", job_variables={"stream_output": True}, build=False, push=False)
"""


def test_a_run_cannot_change_the_command_or_env_of_a_process_worker(server, tmp_path):
    deployed = subprocess.run([sys.executable, "-c", DEPLOY, REPO], env=server, cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    marker, out = tmp_path / "owned", tmp_path / "probe.json"
    attack = ["--job-variable", f"command=sh -c 'touch {marker}; python -m prefect.engine'", "--job-variable",
              'env={"PROBE": "set-by-run", "STOKE_BEAM_ARGS": "--environment_config=sh"}']
    worker_log = open(tmp_path / "worker.log", "wb")
    worker = processes.start([os.path.join(BIN, "prefect"), "worker", "start", "--pool", "locked"], env=server,
                             cwd=REPO, stdout=worker_log, stderr=subprocess.STDOUT)
    try:
        ran = subprocess.run([os.path.join(BIN, "prefect"), "deployment", "run", "probe/probe", "--param",
                              f"out={out}", *attack, "--watch", "--watch-timeout", "180"], env=server, cwd=REPO,
                             capture_output=True, text=True, timeout=240)
    finally:
        processes.stop(worker, 30)
    logs = (tmp_path / "worker.log").read_text()[-3000:]
    assert ran.returncode == 0, ran.stdout[-2000:] + logs
    seen = json.load(open(out))
    assert not marker.exists(), "the run's command ran on the worker"
    assert seen["env"]["PROBE"] is None and seen["env"]["STOKE_BEAM_ARGS"] != "--environment_config=sh", seen


@pytest.mark.parametrize("variables", [{"command": "sh"}, {"env": {"A": "b"}}, {"env.STOKE_BEAM_ARGS": "x"},
                                       {"working_dir": "/tmp"}, {"image": "evil"}, {"job_manifest": {}},
                                       {"service_account_name": "admin"}, {"volumes": ["/:/h"]}])
def test_the_flow_refuses_a_run_that_sets_what_the_deployment_fixes(variables):
    with pytest.raises(ValueError, match="belong to the deployment"):
        check_job_variables(variables)
    check_job_variables({"name": "n", "labels": {"a": "b"}, "gpus": 0})


def test_stoke_deploy_locks_an_existing_loosened_pool(server, monkeypatch):
    for key in ("PREFECT_API_URL", "PREFECT_HOME"):
        monkeypatch.setenv(key, server[key])
    pool = WorkPool(type="process", name="loose")
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="loose", type="process",
                                               base_job_template=ProcessWorker.get_default_base_job_template()))
        work_pools.ensure_pool(pool, None, None)
        variables = client.read_work_pool("loose").base_job_template["variables"]["properties"]
    assert set(variables) <= work_pools.OPEN_VARIABLES and "command" not in variables
