"""`stoke runs`: the retention rule from the command line, and what a run's report says of it."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from components.common.files import write_json
from components.common.run_retention import after_run
from components.contracts.layout import Root
from components.contracts.retention import Pruned
from components.report.report import write_report
from tests.components.common.test_run_retention import HEAVY, RECORD, files, make_run, serve


def stoke(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *argv], capture_output=True, text=True, timeout=120)


def test_a_dry_run_prints_what_prune_would_do_and_removes_nothing(tmp_path):
    root = str(tmp_path / "root")
    runs = [make_run(root, f"run-{n}", age_days=n) for n in range(1, 5)]

    done = stoke("runs", "prune", "--root", root, "--keep", "1", "--keep-records", "2", "--dry-run", "--json")

    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["dry_run"] and summary["keep"] == 1 and summary["keep_records"] == 2
    assert [(r["run_id"], r["action"]) for r in summary["runs"]] == [
        ("run-1", "keep"), ("run-2", "record"), ("run-3", "delete"), ("run-4", "delete")]
    assert summary["freed"] == sum(r["freed"] for r in summary["runs"]) > 0
    assert all(files(run) == set(RECORD + HEAVY) for run in runs)

    listed = stoke("runs", "--root", root, "--keep", "1", "--keep-records", "2")  # without prune: the same, as text
    assert listed.returncode == 0 and "run-3" in listed.stdout and "which would free" in listed.stdout
    assert all(files(run) == set(RECORD + HEAVY) for run in runs)

    done = stoke("runs", "prune", "--root", root, "--keep", "1", "--keep-records", "2", "--json")
    assert done.returncode == 0 and not json.loads(done.stdout.strip().splitlines()[-1])["dry_run"]
    assert files(runs[1]) == set(RECORD) | {"pruned.json"} and not os.path.exists(runs[2].uri)


def test_settings_that_make_no_rule_are_one_line(tmp_path):
    done = stoke("runs", "prune", "--root", str(tmp_path), "--keep", "5", "--keep-records", "2")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "keep_records (2) must be at least keep (5)" in done.stderr
    done = stoke("runs", "prune", "--root", str(tmp_path), "--keep", "0")
    assert done.returncode == 2 and "--keep: Input should be greater than or equal to 1" in done.stderr


def test_the_report_says_what_the_rule_did_and_a_failed_prune_is_a_warning(tmp_path):
    root = str(tmp_path / "root")
    make_run(root, "old", age_days=3)
    make_run(root, "older", age_days=4)
    current = make_run(root, "current", report=False)
    write_settings(current, keep=2)
    for stand_in in (current.metrics, current.gate):  # not results the report could read
        os.remove(stand_in)

    after_run(current)
    report = write_report(current)["summary"]
    assert report["run_folders"].startswith("Run folders: 3 found, 1 reduced to their record, freeing")
    assert report["run_folders"] in pathlib.Path(current.report_md).read_text()

    repository = serve(root, tmp_path, 9, "old")
    pathlib.Path(repository.lineage_uri(9)).write_text("{")
    after_run(current)  # the run's next attempt ends while a lineage cannot be read
    report = write_report(current)["summary"]
    assert "Pruning the older run folders failed" in report["run_folders"] and report["run_folders"] in report["alerts"]
    assert "> **Warning.** Pruning the older run folders failed" in pathlib.Path(current.report_md).read_text()
    assert files(Root(root).run("old")) == set(RECORD + HEAVY)


def write_settings(run, **runs) -> None:
    pathlib.Path(run.config).write_text(json.dumps({"runs": runs}))


def test_no_report_is_rebuilt_for_a_run_the_rule_deleted_or_is_deleting(tmp_path):
    root = str(tmp_path / "root")
    doomed = make_run(root, "doomed")
    write_json(doomed.pruned, Pruned(run_id="doomed", pruned_at="2026-01-01T00:00:00Z", kept="nothing").to_json())
    os.remove(doomed.report_json)  # a deletion stopped halfway

    done = stoke("report", "--root", root, "--run-id", "doomed")
    assert done.returncode == 1 and "run doomed is being deleted by the retention rule" in done.stderr
    assert not os.path.exists(doomed.report_json)

    done = stoke("report", "--root", root, "--run-id", "gone")
    assert done.returncode == 1 and "there is no run gone under" in done.stderr
    assert not os.path.exists(Root(root).run("gone").uri)  # no folder made for a report of nothing
