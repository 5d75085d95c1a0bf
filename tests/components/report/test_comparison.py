"""The report's Gate section says the paired difference in words and draws its interval."""
from __future__ import annotations

import os
from pathlib import Path

from components.common.files import read_json, read_result, write_json
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
    assert read_result(str(WRITTEN), GateResult).comparison is None


def test_the_report_shows_the_difference_with_its_interval(tmp_path):
    run = Root(str(tmp_path)).run("r1")
    write_json(run.result("gate"), read_json(str(WRITTEN)) | {"comparison": COMPARISON})
    written = write_report(run)
    markdown = written["markdown"]
    assert ("Candidate minus served version 1796136026 on 175 eval records: -0.023 (95% interval -0.059 to +0.004; "
            "McNemar's exact p = 0.12; 0 records only the candidate got right, 4 only the served version). "
            "Allowed regression 0.01: a drop beyond the allowance, but within noise.") in markdown
    assert ("This eval set detects drops of about 0.044 with 80% power; decided on the interval (gate.decision: "
            "evidence)") in markdown
    assert "--decision" not in markdown  # a setting of the run, named as its config says it: no flag `stoke run` lacks
    assert "![paired difference](comparison.png)" in markdown
    assert open(run.comparison_plot, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert written["summary"]["gate"]["comparison"]["interval"] == [-0.0586, 0.0044]
    assert os.path.basename(written["summary"]["plots"]["comparison"]) == "comparison.png"


def per_class_row(label, n, right, baseline_right, b, c, p_value, threshold, verdict):
    return {"label": label, "example_count": n, "right": right, "baseline_right": baseline_right,
            "discordant": [b, c], "p_value": p_value, "threshold": threshold, "verdict": verdict}


PER_CLASS = {"version": 1796136026, "method": "McNemar exact test, one-sided, per class; Holm step-down over the classes",
             "level": 0.05, "max_regression": 0.01, "classes": [
                 per_class_row("red", 20, 10, 20, 0, 10, 0.5 ** 10, 0.05 / 3, "worse"),
                 per_class_row("green", 20, 19, 18, 1, 0, 1.0, 0.05, "held"),
                 per_class_row("blue", 20, 15, 20, 0, 5, 0.5 ** 5, 0.05 / 2, "within noise")]}


def test_the_per_class_table_shows_the_served_figures_and_the_verdict(tmp_path):
    """red forgotten, green better, blue down within noise; white is new, so the served version has no figure."""
    run = Root(str(tmp_path)).run("r1")
    gate = read_json(str(WRITTEN))
    gate["labels"] = ["red", "green", "blue", "white"]
    gate["metrics"] |= {"per_class_accuracy": {"red": 0.5, "green": 0.95, "blue": 0.75, "white": 0.25},
                        "per_class_examples": {"red": 20, "green": 20, "blue": 20, "white": 4}}
    write_json(run.result("gate"), gate | {"comparison": COMPARISON | {"per_class": PER_CLASS}})
    written = write_report(run)
    markdown = written["markdown"]
    assert ("Class by class against served version 1796136026: McNemar's exact one-sided test on each class's records, "
            "Holm's step-down over the 3 classes at 0.05; a class is worse when its fall is significant and beyond the "
            "allowed regression 0.01.") in markdown
    table = markdown[markdown.index("| class | eval examples | accuracy | served |"):].split("\n\n")[0].splitlines()
    assert table[2:] == [
        "| blue | 20 | 0.7500 (15/20) | 1.0000 (20/20) | 0 / 5 | 0.031 | 0.025 | fell, within noise |",
        "| green | 20 | 0.9500 (19/20) | 0.9000 (18/20) | 1 / 0 | 1 | 0.05 | held |",
        "| red | 20 | 0.5000 (10/20) | 1.0000 (20/20) | 0 / 10 | 0.00098 | 0.017 | **worse**: a reason to refuse |",
        "| white | 4 | 0.2500 | - | - | - | - | new: not compared |"]
    assert written["summary"]["gate"]["comparison"]["per_class"]["classes"][0]["verdict"] == "worse"


def test_without_a_per_class_comparison_the_table_has_the_candidate_alone(tmp_path):
    run = Root(str(tmp_path)).run("r1")
    write_json(run.result("gate"), read_json(str(WRITTEN)) | {"comparison": COMPARISON})
    markdown = write_report(run)["markdown"]
    assert "| class | eval examples | accuracy |\n| --- | --- | --- |\n| four | 1 | 0.0000 |" in markdown
    assert "Class by class" not in markdown


def test_the_reference_has_a_table_of_its_own(tmp_path):
    """Held to an older version too, on the records it answered: red slid from 17/18 to 8/18 over five versions."""
    run = Root(str(tmp_path)).run("r1")
    gate = read_json(str(WRITTEN))
    gate["labels"] = ["red", "green", "blue", "white"]
    gate["metrics"] |= {"per_class_accuracy": {"red": 0.5, "green": 0.95, "blue": 0.75, "white": 0.25},
                        "per_class_examples": {"red": 20, "green": 20, "blue": 20, "white": 4}}
    reference = PER_CLASS | {"version": 1796000000, "pushed_at": "2026-11-28T02:00:00Z", "days": 6, "versions_since": 5,
                             "classes": [per_class_row("red", 18, 8, 17, 0, 9, 0.5 ** 9, 0.05 / 3, "worse"),
                                         per_class_row("green", 18, 17, 17, 1, 1, 0.75, 0.05, "held")]}
    write_json(run.result("gate"), gate | {"comparison": COMPARISON | {"per_class": PER_CLASS, "reference": reference}})
    markdown = write_report(run)["markdown"]
    assert ("Class by class against the reference, version 1796000000 (pushed 2026-11-28, 6 days ago; 5 versions "
            "pushed since), on the eval records both answered: McNemar's exact one-sided test on each class's records, "
            "Holm's step-down over the 2 classes at 0.05;") in markdown
    table = markdown[markdown.index("| class | eval examples | accuracy | reference |"):].split("\n\n")[0].splitlines()
    assert table[0].startswith("| class | eval examples | accuracy | reference | only candidate right / only reference "
                               "right |")
    assert table[2:] == [
        "| blue | 20 | 0.7500 | - | - | - | - | not answered by the reference |",
        "| green | 18 | 0.9444 (17/18) | 0.9444 (17/18) | 1 / 1 | 0.75 | 0.05 | held |",
        "| red | 18 | 0.4444 (8/18) | 0.9444 (17/18) | 0 / 9 | 0.002 | 0.017 | **worse**: a reason to refuse |",
        "| white | 4 | 0.2500 | - | - | - | - | not answered by the reference |"]
    assert "| class | eval examples | accuracy | served |" in markdown  # and the served version's table stays
