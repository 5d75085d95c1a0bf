"""Results are strict both ways: a sample of each file loads and writes back the same, and a renamed
key anywhere fails loudly."""
import json
import logging
from pathlib import Path

import pytest

from components.common.files import read_json, read_result, write_json
from components.contracts import lineage, results, summaries
from components.contracts.layout import Root
from components.report.report import build_report

WRITTEN = Path(__file__).parent / "samples"
FILES = {
    "_MANIFEST.json": results.SpanManifest,
    "metrics.json": results.TrainMetrics,
    "gate.json": results.GateResult,
    "pushed.json": lineage.Pushed,
    "stoke_lineage.json": lineage.Lineage,  # a rolled-back version's
    "retired.json": lineage.Lineage,
    "ingest-summary.json": summaries.IngestSummary,
    "preflight-summary.json": summaries.PreflightSummary,
    "push-summary.json": summaries.PushSummary,
    "report.json": summaries.RunReport,
}
# The summary each stage left in the same run as report.json: the report is built from them.
SUMMARIES = {
    "preflight": "preflight-summary.json",
    "ingest": "ingest-summary.json",
    "train": "metrics.json",
    "gate": "gate.json",
    "push": "push-summary.json",
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_sample_of_each_file_loads_and_writes_back_the_same(name, tmp_path):
    model = FILES[name]
    loaded = read_result(str(WRITTEN / name), model)
    copy = str(tmp_path / name)
    write_json(copy, loaded.to_json())
    assert read_result(copy, model) == loaded
    original = read_json(str(WRITTEN / name))
    # Keys a sample leaves out come back as their defaults (null), at any depth; nothing else changes.
    assert _without_new_nulls(read_json(copy), original) == original


def _without_new_nulls(written, original):
    if isinstance(written, list) and isinstance(original, list) and len(written) == len(original):
        return [_without_new_nulls(w, o) for w, o in zip(written, original)]
    if not isinstance(written, dict) or not isinstance(original, dict):
        return written
    return {k: _without_new_nulls(v, original.get(k)) for k, v in written.items() if k in original or v is not None}


@pytest.mark.parametrize("name", sorted(n for n, model in FILES.items() if issubclass(model, summaries.Summary)))
def test_summaries_write_back_exactly(name):
    """A summary holds the keys its stage set: reading and writing adds none, not even nulls."""
    assert read_result(str(WRITTEN / name), FILES[name]).to_json() == read_json(str(WRITTEN / name))


@pytest.mark.parametrize("name", sorted(FILES))
def test_any_renamed_key_of_any_file_fails(name, tmp_path):
    data = read_json(str(WRITTEN / name))
    for key in data:
        renamed = {(f"{key}_v2" if k == key else k): v for k, v in data.items()}
        with pytest.raises(results.ResultError, match=f"{key}_v2"):
            FILES[name].check(renamed, name)


def test_a_renamed_key_fails_loudly_naming_the_file_and_both_keys(tmp_path):
    metrics = read_json(str(WRITTEN / "metrics.json"))
    metrics["img_per_sec"] = metrics.pop("images_per_sec")
    uri = str(tmp_path / "metrics.json")
    write_json(uri, metrics)
    with pytest.raises(results.ResultError) as error:
        read_result(uri, results.TrainMetrics)
    assert uri in str(error.value) and "images_per_sec" in str(error.value) and "img_per_sec" in str(error.value)


def test_a_report_over_a_renamed_key_fails_instead_of_showing_nothing(tmp_path):
    run = Root(str(tmp_path)).run("r1")
    validation = read_json(str(WRITTEN / "gate.json"))
    write_json(run.result("gate"), validation)
    assert build_report(run).metrics.accuracy == validation["metrics"]["accuracy"]
    validation["metrics"]["acc"] = validation["metrics"].pop("accuracy")
    write_json(run.result("gate"), validation)
    with pytest.raises(results.ResultError, match="accuracy"):
        build_report(run)


def test_the_report_of_the_sample_summaries_is_the_sample_report(tmp_path):
    run = Root(str(tmp_path)).run("first")
    for stage, name in SUMMARIES.items():
        write_json(run.result(stage), read_json(str(WRITTEN / name)))
    report, sample = build_report(run).to_json(), read_json(str(WRITTEN / "report.json"))
    for key in ("status", "message", "blessed", "pushed_version", "reasons", "metrics", "model_uri",
                "sections", "ingest", "gate", "push", "stages"):
        assert _without_new_nulls(report[key], sample[key]) == sample[key], key
    train = {k: v for k, v in report["train"].items() if k not in ("profiler", "data_service")}
    assert _without_new_nulls(train, sample["train"]) == sample["train"]  # `start`: None in a record made before
    assert report["train"]["data_service"] is None  # read in the trainer


@pytest.mark.parametrize("stage", sorted(SUMMARIES))
def test_the_report_refuses_a_summary_with_a_renamed_key(stage, tmp_path):
    run = Root(str(tmp_path)).run("r1")
    for other, name in SUMMARIES.items():
        write_json(run.result(other), read_json(str(WRITTEN / name)))
    summary = read_json(run.result(stage))
    key = sorted(summary)[0]
    summary[f"{key}_v2"] = summary.pop(key)
    write_json(run.result(stage), summary)
    with pytest.raises(results.ResultError, match=f"{key}_v2") as error:
        build_report(run)
    assert run.result(stage) in str(error.value)


def test_a_progress_event_is_told_from_a_summary_and_from_text():
    line = json.dumps({"event": "progress", "stage": "ingest", "done": 12.5, "total": 50, "unit": "MB",
                       "seconds": 10})
    event = summaries.event(line)
    assert event == summaries.Progress(stage="ingest", done=12.5, total=50, unit="MB", seconds=10)
    assert event.fraction == 0.25 and event.describe() == "ingest: 12 of 50 MB after 10 s"
    assert summaries.event(json.dumps(event.to_json())) == event
    assert summaries.event(json.dumps({"published": False, "error": "x"})) is None  # a summary
    assert summaries.event("Epoch 1/2") is None and summaries.event("{not json") is None
    with pytest.raises(results.ResultError, match="done"):
        summaries.event(json.dumps({"event": "progress", "stage": "ingest", "dnoe": 1, "total": 2, "unit": "MB",
                                  "seconds": 1}))
    with pytest.raises(results.ResultError):  # an event, though of a kind this version does not know
        summaries.event(json.dumps({"event": "heartbeat"}))


def test_failures_print_the_stages_summary_with_its_error(capsys):
    from components.common import program

    def fail():
        raise OSError("the bucket did not answer")

    assert program.main("stoke x", True, fail, str, errors=(OSError,), failed=summaries.PushSummary(pushed=False)) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"pushed": False, "error": "the bucket did not answer"}
    assert summaries.PushSummary.check(printed, "stdout").error == printed["error"]


def test_a_file_that_is_not_json_is_named(tmp_path):
    bad = tmp_path / "_MANIFEST.json"
    bad.write_text('{"span": 1,')
    with pytest.raises(results.ResultError, match=str(bad)):
        read_result(str(bad), results.SpanManifest)


def test_the_manifest_written_by_ingest_is_what_readers_see(tmp_path):
    manifest = read_result(str(WRITTEN / "_MANIFEST.json"), results.SpanManifest)
    assert json.loads(json.dumps(manifest.to_json()))["counts"] == manifest.counts.to_json()
    assert {s.split for s in manifest.shards} <= {"train", "eval"}


@pytest.mark.parametrize("change", [{"sha256": None}, {"sha256": "not hex"}, {"file": "../span-00002/x.tfrecord.gz"},
                                    {"file": "sub/x.tfrecord.gz"}, {"file": ".."}, {"file": "a\\b"}])
def test_a_shard_entry_names_a_file_of_its_span_and_its_digest(change):
    """The digest is what a cached copy must match; a name with a path could point a reader out of the span."""
    data = json.loads((WRITTEN / "_MANIFEST.json").read_text())
    data["shards"][0] = {k: v for k, v in {**data["shards"][0], **change}.items() if v is not None}
    with pytest.raises(results.ResultError, match="shards.0"):
        results.SpanManifest.check(data, "_MANIFEST.json")


def test_write_json_reaches_the_disk_before_it_takes_the_name(tmp_path, monkeypatch):
    """Rename without fsync can leave an empty file under the final name after a power cut."""
    import os

    from components.common import files

    target = tmp_path / "sub" / "x.json"
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), target.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    files.write_json(str(target), {"a": 1})
    assert read_json(str(target)) == {"a": 1}
    assert (str(target) + ".tmp", False) in synced  # the data, before the rename
    assert (str(target.parent), True) in synced  # the folder, so the rename itself survives


def test_a_summary_says_itself_in_lines_and_its_warnings_are_the_warning_ones():
    ingest = summaries.IngestSummary.model_validate(read_json(str(WRITTEN / "ingest-summary.json")))
    level, line = ingest.log_lines()[0]
    assert level == logging.INFO and "eval records in" in line
    near = {"count": 1, "examples": [], "warning": "the eval share moved to 0.4"}
    assert ingest.model_copy(update={"near_duplicates": summaries.NearDuplicates(**near)}).log_lines()[-1] == (
        logging.WARNING, "the eval share moved to 0.4")
    gate = results.GateResult.model_validate(read_json(str(WRITTEN / "gate.json")))
    refused = gate.model_copy(update={"blessed": False, "reasons": ["accuracy 0.1 below 0.5"]})
    assert refused.log_lines()[0][0] == logging.WARNING and refused.log_lines()[0][1].startswith("NOT BLESSED: accuracy")
    assert (logging.INFO, "  - accuracy 0.1 below 0.5") in refused.log_lines()


def test_the_hints_to_let_a_held_span_in_name_the_root_it_is_under(tmp_path):
    root = str(tmp_path / "my root")
    finding = summaries.DataAnomaly(kind="new_label", severity="error", count=3, message="label 'x' is new: let the "
                                    "span in with `stoke spans release 2 --root ROOT`")
    held = summaries.DataCheckSummary(root=root, spans=[summaries.SpanCheck(
        span=2, status="quarantined", anomalies=[finding], history_spans=[1], label_counts={"x": 3},
        record_uri=f"{root}/spans/span-2/_DATACHECK.json")])
    said = [line for level, line in held.log_lines() if level == logging.WARNING]
    assert len(said) == 2 and all(f"--root '{root}'" in line and "ROOT`" not in line for line in said), said
    assert "--root ROOT" in held.model_copy(update={"root": None}).log_lines()[-1][1]  # by hand, a record alone


def test_every_hint_to_let_a_held_span_in_runs_as_printed_under_a_root_with_a_space(tmp_path):
    """The log, the report, training's refusal and a skipped run's reason each name the same command."""
    from components.common.spans import CheckRecord
    from components.report.data_section import section

    root = str(tmp_path / "my root")
    command = f"stoke spans release 2 --root '{root}'"
    assert summaries.release_command(2, root) == command and summaries.release_command(2, None).endswith("--root ROOT")
    held = summaries.DataCheckSummary(root=root, spans=[summaries.SpanCheck(
        span=2, status="quarantined", anomalies=[], history_spans=[1], label_counts={"x": 3},
        record_uri=f"{root}/spans/span-2/_DATACHECK.json")])
    assert f"`{command}`" in "\n".join(section(held, None, root, {}))
    record = summaries.DataCheckRecord(span=2, check_version=summaries.DATACHECK_VERSION, status="quarantined",
                                       checked_at="2026-12-05T00:00:00Z", reasons=["label 'x' is new"], anomalies=[])
    assert f"`{command}`" in CheckRecord(2, record, None).refusal(root)
    assert f"`stoke datacheck --root '{root}' --span 2`" in CheckRecord(2, None, None).refusal(root)
