"""The report's Gate section says the paired difference in words and draws its interval."""
from __future__ import annotations

import os
from pathlib import Path

from components.common.files import read_json, write_json
from components.contracts.layout import Root
from components.contracts.results import GateResult
from components.report.report import write_report

WRITTEN = Path(__file__).parents[1] / "contracts" / "samples" / "gate.json"
# The demo's numbers: seed 1's candidate (0.966) against seed 2's version (0.989), 175 digits.
COMPARISON = {"version": 1796136026, "example_count": 175, "accuracy": 169 / 175, "baseline_accuracy": 173 / 175,
              "difference": -4 / 175, "interval": [-0.0586, 0.0044], "p_value": 0.125,
              "method": "McNemar exact test; Newcombe hybrid score interval (paired, method 10)",
              "discordant": [0, 4], "detectable_difference": 0.0442, "decision": "evidence", "confidence": 0.95,
              "best_retained": None}


def test_a_gate_without_a_served_version_has_no_comparison():
    assert GateResult.read(str(WRITTEN)).comparison is None


def test_the_report_shows_the_difference_with_its_interval(tmp_path):
    run = Root(str(tmp_path)).run("r1")
    write_json(run.summary("gate"), read_json(str(WRITTEN)) | {"comparison": COMPARISON})
    written = write_report(run)
    markdown = written["markdown"]
    assert ("Candidate minus served version 1796136026 on 175 eval records: -0.023 (95% interval -0.059 to +0.004; "
            "McNemar's exact p = 0.12; 0 records only the candidate got right, 4 only the served version). "
            "Allowed regression 0.01: a drop beyond the allowance, but within noise.") in markdown
    assert "This eval set detects drops of about 0.044 with 80% power; decided on the interval" in markdown
    assert "![paired difference](comparison.png)" in markdown
    assert open(run.comparison_plot, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert written["summary"]["gate"]["comparison"]["interval"] == [-0.0586, 0.0044]
    assert os.path.basename(written["summary"]["plots"]["comparison"]) == "comparison.png"
