"""What a run's report says of the retention rule it applied as it ended."""
from __future__ import annotations

import json
import os
import pathlib

from components.common.run_retention import after_run
from components.contracts.layout import Root
from components.report.report import write_report
from tests.components.common.test_run_retention import HEAVY, RECORD, files, make_run, serve


def test_the_report_says_what_the_rule_did_and_a_failed_prune_is_a_warning(tmp_path):
    root = str(tmp_path / "root")
    make_run(root, "old", age_days=3)
    make_run(root, "older", age_days=4)
    current = make_run(root, "current", report=False)
    write_settings(current, keep=2)
    os.remove(current.summary("train"))  # a stand-in, not a summary the report could read

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
