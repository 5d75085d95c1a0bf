"""One Prefect test server (SQLite in a temporary folder) for every flow test: starting one costs
seconds, and flows, deployments, events and automations all live in it."""
from __future__ import annotations

import os

import pytest

from components.demo import write_digits

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")

# Small but real: digits at their demo size, one quick epoch, the Beam job in one process.
TINY_MODEL = {"image_size": 32, "batch_size": 8, "probe_steps": 2, "steps_per_epoch": 4}
TINY_BEAM = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="session", autouse=True)
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture
def digits(tmp_path):
    """A source folder with 40 demo digits in class folders (all ten classes)."""
    source = str(tmp_path / "digits")
    write_digits(source, limit=40)
    return source
