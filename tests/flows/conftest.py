"""One Prefect test server (SQLite in a temporary folder) for every flow test: starting one costs
seconds, and flows, deployments, events and automations all live in it."""
from __future__ import annotations

import os

import pytest

from flows.demo import write_digits

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")
# Events reach the database (and the tests' queries) within half a second instead of five.
os.environ.setdefault("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL", "0.5")

# Small but real: digits at their demo size, one quick epoch, the Beam job in one process.
TINY_MODEL = {"preset": "demo", "epochs": 1, "batch_size": 8, "probe_steps": 2, "steps_per_epoch": 4}
TINY_BEAM = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="session", autouse=True)
def prefect_server(prefect_api):
    """Every flow test talks to the session's Prefect test server."""


@pytest.fixture(scope="session")
def pushed_run(tmp_path_factory):
    """The train flow once, end to end on 40 real digits, with a floor any model passes: blessed and
    pushed as version 1. Later tests use its ROOT as one that already serves a model."""
    from flows.parameters import GateSettings, PushSettings, TrainSettings
    from flows.train import train

    base = tmp_path_factory.mktemp("pushed")
    source, root = str(base / "digits"), str(base / "root")
    write_digits(source, limit=40)
    state = train(source=source, root=root, train=TrainSettings(**TINY_MODEL),
                  gate=GateSettings(min_accuracy=0.0), push=PushSettings(build_image=False),
                  beam_args=TINY_BEAM, run_id="first", return_state=True)
    return {"source": source, "root": root, "state": state}


@pytest.fixture
def digits(tmp_path):
    """A source folder with 40 demo digits in class folders (all ten classes)."""
    source = str(tmp_path / "digits")
    write_digits(source, limit=40)
    return source
