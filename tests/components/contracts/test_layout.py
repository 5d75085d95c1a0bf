import json

import pytest

from components.common.files import write_json
from components.common.spans import Spans
from components.contracts.layout import Root, parse_spans
from components.contracts.results import ResultError, SpanManifest


@pytest.mark.parametrize("run_id", ["../x", "a/b", "..", ".hidden", "-x", "", "a" * 129, "x\n", "s3://b/x"])
def test_run_ids_that_could_leave_runs_are_refused(run_id):
    with pytest.raises(ValueError, match="bad run id"):
        Root("/tmp/root").run(run_id)


def test_a_run_folder_names_its_files():
    run = Root("s3://bucket/root").run("20260101-x")
    assert run.uri == "s3://bucket/root/runs/20260101-x" and run.run_id == "20260101-x"
    assert run.metrics == "s3://bucket/root/runs/20260101-x/metrics.json"
    assert run.result("ingest") == "s3://bucket/root/runs/20260101-x/ingest.json"
    assert run.result("train") == run.metrics and run.result("gate") == run.gate  # one file per stage's result
    assert len({run.metrics, run.gate, run.pushed, run.blessed, run.not_blessed, run.candidate,
                run.report_md, run.report_json, run.warmup, run.tfma}) == 10


@pytest.mark.parametrize("text, expected", [
    (None, None), ("all", None), ("3", [3]), ("1,4-6", [1, 4, 5, 6]), ("2-3,3", [2, 3])])
def test_parse_spans(text, expected):
    assert parse_spans(text) == expected


def test_parse_spans_rejects_bad_lists():
    with pytest.raises(ValueError, match="bad span"):
        parse_spans("1,x")
    with pytest.raises(ValueError, match="bad span range"):
        parse_spans("5-2")


def test_manifests_read_without_their_sources_keep_the_rest(tmp_path):
    root = Root(str(tmp_path))
    manifest = SpanManifest(span=1, created="2026-01-01T00:00:00Z", source="/in", labels=["cat", "dog"], shards=[],
                            counts={"train": 2, "eval": 0, "dead_letter": 0, "duplicates": 0},
                            sources=[{"uri": f"/in/cat/{i}.png", "size": i, "version": "v"} for i in range(2)])
    write_json(root.manifest(1), manifest.to_json())
    [light] = Spans(root).each_manifest(checked=False, sources=False)
    assert light.sources == [] and light.labels == ["cat", "dog"] and light.counts.train == 2
    assert len(Spans(root).manifests(checked=False)[0].sources) == 2 and Spans(root).published() == [1]
    (tmp_path / "data" / "spans" / "span-00001" / "_MANIFEST.json").write_text('["not", "a manifest"]')
    with pytest.raises(ResultError, match="_MANIFEST.json is not a valid SpanManifest"):
        list(Spans(root).each_manifest(checked=False, sources=False))


def test_spans_and_records_written_by_another_process_are_seen_on_a_bucket(s3_bucket):
    """Stage programs write under ROOT while the flow's process holds listings of it: a span published,
    a record written or removed since this process listed the folder is seen as it is now."""
    import boto3

    root = Root(f"s3://{s3_bucket}/root")
    manifest = SpanManifest(span=1, created="2026-01-01T00:00:00Z", source="/in", labels=["cat"], shards=[], sources=[],
                            counts={"train": 0, "eval": 0, "dead_letter": 0, "duplicates": 0})
    write_json(root.manifest(1), manifest.to_json())
    assert Spans(root).published() == [1] and Spans(root).unchecked() == [1]  # listed: the folders are in any cache now
    other = boto3.client("s3")  # another process's writes, as the store sees them
    other.put_object(Bucket=s3_bucket, Key="root/data/spans/span-00002/_MANIFEST.json",
                     Body=manifest.model_copy(update={"span": 2}).model_dump_json().encode())
    record = {"span": 1, "check_version": 2, "status": "ok", "checked_at": "2026-01-01T00:00:00Z",
              "reasons": [], "anomalies": [], "manifest_sha256": Spans(root).manifest_sha256(1)}
    other.put_object(Bucket=s3_bucket, Key="root/data/spans/span-00001/_DATACHECK.json",
                     Body=json.dumps(record).encode())
    assert Spans(root).published() == [1, 2] and Spans(root).unchecked() == [2] and Spans(root).check_record(1).trusted
    other.delete_object(Bucket=s3_bucket, Key="root/data/spans/span-00001/_DATACHECK.json")
    assert Spans(root).unchecked() == [1, 2]
