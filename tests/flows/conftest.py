"""One Prefect test server (SQLite in a temporary folder) for every flow test: starting one costs
seconds, and flows, deployments, events and automations all live in it."""
from __future__ import annotations

import os
import shutil

import pytest

from flows.demo import write_digits
from tests.once import once_per_run

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")
# Events reach the database (and the tests' queries) within half a second instead of five.
os.environ.setdefault("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL", "0.5")

# Small but real: digits at their demo size, one quick epoch, the Beam job in one process.
TINY_MODEL = {"epochs": 1, "batch_size": 8, "input_probe_steps": 2, "steps_per_epoch": 4}
TINY_BEAM = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="session", autouse=True)
def prefect_server(prefect_api):
    """Every flow test talks to the session's Prefect test server."""


# The settings of the session's first run, as a user writes them: a file, then --set overrides.
FIRST_RUN_CONFIG = f"""
preset: demo
beam_args: {TINY_BEAM}
preflight: {{sample_mb: 4}}
ingest: {{shard_mb: 8}}
datacheck: {{min_class_examples: 1}}
train: {{epochs: 1, batch_size: 8, input_probe_steps: 2, steps_per_epoch: 4}}
gate: {{top_k: 3}}
push: {{build_image: false, keep: 2}}
"""
# What the command line lays over the file: the override wins over the file's steps_per_epoch.
FIRST_RUN_OVERRIDES = ["gate.min_accuracy=0.0", "train.steps_per_epoch=3"]


@pytest.fixture(scope="session")
def pushed_run(tmp_path_factory):
    """The train flow once per test run, end to end on 40 real digits, configured as `stoke run SOURCE
    --root ROOT --config FILE --set ...` configures it, with a floor any model passes: blessed and pushed
    as version 1. Later tests use its ROOT as one that already serves a model, and a copy of it
    (`copy_of`) to run flows on: every worker reads this one. The run's state, and what the Prefect
    server of the worker that ran it says of its task runs and artifacts, come as a record."""
    return once_per_run(tmp_path_factory, "pushed-run", first_run)


def first_run(base) -> dict:
    import argparse

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.commands import add_run_arguments, checked, flow_parameters
    from flows.pipeline import pipeline

    source, root, config_file = str(base / "digits"), str(base / "root"), base / "first.yaml"
    write_digits(source, limit=40)
    config_file.write_text(FIRST_RUN_CONFIG)
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    argv = [source, "--root", root, "--config", str(config_file), "--run-id", "first"]
    run_id, config = checked(parser.parse_args([*argv, *(f"--set={item}" for item in FIRST_RUN_OVERRIDES)]))
    state = pipeline(**flow_parameters(config), run_id=run_id, return_state=True)
    ran = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        tasks, artifacts = client.read_task_runs(flow_run_filter=ran), client.read_artifacts(flow_run_filter=ran)
    return {"source": source, "root": root, "config_file": str(config_file), "completed": state.is_completed(),
            "message": state.message, "summary": state.result() if state.is_completed() else None,
            "task_tags": {task.name.rsplit("-", 1)[0]: sorted(task.tags) for task in tasks},
            "artifacts": [{"key": a.key, "type": a.type, "data": a.data} for a in artifacts]}


def copy_of(pushed_run, tmp_path) -> tuple[str, str]:
    """The served ROOT of the first run, and its source, copied: for a test that runs a flow on it."""
    source, root = str(tmp_path / "digits"), str(tmp_path / "root")
    shutil.copytree(pushed_run["source"], source)
    shutil.copytree(pushed_run["root"], root)
    return source, root


def one_class_night(source: str, pool, name: str = "seven") -> int:
    """Lands in `source` the digits of class `name` among the demo's first 200 that the first run's 40 do not
    hold (about sixteen): a night of one line or one camera, of a class the served model knows."""
    write_digits(str(pool), limit=200)
    files = sorted(path for path in (pool / name).glob("*.png") if int(path.stem.split("-")[1]) >= 40)
    os.makedirs(os.path.join(source, name), exist_ok=True)
    for path in files:
        shutil.copy(path, os.path.join(source, name, path.name))
    return len(files)


@pytest.fixture
def digits(tmp_path):
    """A source folder with 40 demo digits in class folders (all ten classes)."""
    source = str(tmp_path / "digits")
    write_digits(source, limit=40)
    return source
