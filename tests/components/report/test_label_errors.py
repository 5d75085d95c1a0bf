"""The Data check section reads the label check from the typed findings: why it was skipped, or the
flagged files one by one (the first 50; the record holds them all) with a count per pair of classes,
and the findings about the span in the anomaly table without the files'."""
from __future__ import annotations

from components.common.files import write_json
from components.contracts.label_check import LabelCheck, SuspectedLabel
from components.contracts.layout import Root
from components.contracts.summaries import DataAnomaly, DataCheckSummary, SpanCheck
from components.report.report import write_report


def span_check(label_check: LabelCheck, files: int = 0) -> SpanCheck:
    flagged = [DataAnomaly(kind="label_error", severity="warning", file=f"s3://b/cat/{i}.jpg", message="m",
                           label=SuspectedLabel(given="cat", predicted="dog", confidence=0.97, given_probability=0.01,
                                                split="train")) for i in range(files)]
    about = [DataAnomaly(kind="label_error", severity="warning", count=files, message=f"{files} of 400 records look "
                         "mislabelled", examples=[f.file for f in flagged[:5]])] if files else []
    return SpanCheck(span=2, status="warning", anomalies=about + flagged, history_spans=[1], label_counts={"cat": 400},
                     record_uri="/r/data/spans/span-00002/_DATACHECK.json", label_check=label_check)


def markdown(tmp_path, check: SpanCheck) -> str:
    run = Root(str(tmp_path)).run("r1")
    write_json(run.result("datacheck"), DataCheckSummary(spans=[check]).to_json())
    return write_report(run)["markdown"]


def test_a_skipped_label_check_says_why(tmp_path):
    shown = markdown(tmp_path, span_check(LabelCheck(status="skipped", reason="no served model: /r/models/stoke "
                                                                             "holds no version")))
    assert "Label check skipped: no served model: /r/models/stoke holds no version." in shown


def test_flagged_files_are_listed_fifty_at_most_with_their_pairs(tmp_path):
    check = LabelCheck(status="done", model="/r/models/stoke/7", checked=400, unknown=3, flagged=60,
                       pairs=[{"given": "cat", "predicted": "dog", "count": 60}], expected_rate=0.03,
                       expected_from="the floor", p_value=2e-9)
    shown = markdown(tmp_path, span_check(check, files=60))
    assert "Label check by the served model `/r/models/stoke/7`: 400 records judged (3 of classes" in shown
    assert "60 suspected label errors; a clean span would show about 3.0% (the floor), exact binomial test p = 2e-09" in shown
    assert "| cat | dog | 60 |" in shown
    assert "| `s3://b/cat/49.jpg` | train | cat | dog | 97% |" in shown and "s3://b/cat/50.jpg` |" not in shown
    assert "... and 10 more in `/r/data/spans/span-00002/_DATACHECK.json`." in shown
    table = [line for line in shown.splitlines() if line.startswith("| warning | label_error |")]
    assert len(table) == 1 and "60 of 400 records look mislabelled" in table[0]  # the span's, not each file's
