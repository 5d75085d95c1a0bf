"""The gate scenario, built once per test run and shared by the validate, export and serving tests:

1. `good`: a tiny model that learns the colour classes -> blessed -> pushed (first version);
2. `flat`: learning rate 0, so it learns nothing -> refused with reasons; the repository is unchanged;
3. `mixed`: trained under mixed_bfloat16 -> blessed -> pushed as a newer version.

Spans are written the way the ingest job publishes them (tests/components/conftest.py); the runs
use the real components.train, components.gate and components.push in this process.
Tests that change the repository work on a copy (`copy_root`): the scenario's own ROOT is read by
tests on every pytest-xdist worker at once.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil

from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span
from tests.once import once_per_run

TINY = ["--image-size", "32", "--batch-size", "8", "--input-probe-steps", "0", "--network", "small_cnn", "--weights", "none",
        "--no-xla"]


def _last_json(fn, argv: list[str]) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = fn(argv)
    lines = out.getvalue().strip().splitlines()
    return code, (json.loads(lines[-1]) if lines else {})


def train_run(root: str, run_id: str, *extra: str) -> dict:
    from components.train import trainer as train

    code, summary = _last_json(train.run, ["--root", root, "--run-id", run_id, *TINY, "--json", *extra])
    assert code == 0, summary
    return summary


def validate_run(root: str, run_id: str, *extra: str) -> tuple[int, dict]:
    from components.gate import gate as validate

    return _last_json(validate.run, ["--root", root, "--run-id", run_id, "--json", *extra])


def push_run(root: str, run_id: str, *extra: str) -> tuple[int, dict]:
    from components.push import push as export

    return _last_json(export.run, ["--root", root, "--run-id", run_id, "--json", *extra])


def listing(root: str) -> list[str]:
    base = os.path.join(root, "models")
    return sorted(os.path.relpath(os.path.join(d, f), base) for d, _, fs in os.walk(base) for f in fs)


def gate_scenario(tmp_path_factory) -> dict:
    """The scenario, made once per test run (several test modules, on any worker, ask for it)."""
    return once_per_run(tmp_path_factory, "gate-scenario", lambda folder: build(str(folder / "root")))


def build(root: str) -> dict:
    write_span(root, 1, {"train": tiny_records(64), "eval": tiny_records(24, offset=5000)},
               TRAIN_LABELS, {"train": 2, "eval": 2})
    result = {"root": root, "train": {}, "validate": {}, "push": {}, "listing": {}}
    result["train"]["good"] = train_run(root, "good", "--epochs", "3", "--precision", "float32")
    result["validate"]["good"] = validate_run(root, "good")
    result["push"]["good"] = push_run(root, "good")
    result["listing"]["after_good"] = listing(root)

    result["train"]["flat"] = train_run(root, "flat", "--epochs", "1", "--precision", "float32",
                                        "--learning-rate", "0")
    result["validate"]["flat"] = validate_run(root, "flat")
    result["push"]["flat"] = push_run(root, "flat")
    result["listing"]["after_flat"] = listing(root)

    result["train"]["mixed"] = train_run(root, "mixed", "--epochs", "3", "--precision", "mixed_bfloat16")
    result["validate"]["mixed"] = validate_run(root, "mixed")
    result["push"]["mixed"] = push_run(root, "mixed")
    result["listing"]["after_mixed"] = listing(root)
    return result


def copy_root(scenario: dict, tmp_path) -> str:
    target = str(tmp_path / "root")
    shutil.copytree(scenario["root"], target, symlinks=True)
    return target


def _digest(*paths: str) -> str:
    """Of every file under `paths`, by its path relative to its own folder and its bytes."""
    digest = hashlib.sha256()
    for path in paths:
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
        for name in files:
            digest.update(os.path.relpath(name, path).encode() + b"\0" + open(name, "rb").read())
    return digest.hexdigest()


def scenario_serving_checks(scenario: dict, monkeypatch) -> None:
    """The gate's serving check answered from the scenario's own report for the very SavedModel and
    warm-up requests its gate runs checked: a test that gates one of its runs again is about the
    decision, and the check's fresh process costs seconds of CPU loading TensorFlow to report the same
    on the same files (test_gate.py checks its report). Any other model is checked for real."""
    from components.contracts.layout import Root
    from components.gate import gate as validate

    reports = {}
    for run_id, (_, summary) in scenario["validate"].items():
        run = Root(scenario["root"]).run(run_id)
        reports[_digest(run.candidate, run.warmup)] = summary["serving_check"]
    real = validate.serving_check

    def check(model_dir: str, warmup_path: str, model_name: str) -> dict:
        report = reports.get(_digest(model_dir, warmup_path))
        return dict(report, model_dir=model_dir) if report else real(model_dir, warmup_path, model_name)

    monkeypatch.setattr(validate, "serving_check", check)
