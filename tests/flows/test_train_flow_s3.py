"""The `train` flow with SOURCE and ROOT in an S3 bucket (moto on 127.0.0.1), as a team on AWS runs it:
TensorFlow reads the shards through the local cache, and everything lands in the bucket."""
from __future__ import annotations

import boto3
import fsspec
import pytest

from components.common.files import read_json
from components.common.repository import Repository
from components.contracts.config import GateConfig, PreflightConfig, PushConfig, ShardCacheConfig, TrainConfig
from components.contracts.layout import Root
from flows.demo import write_digits
from flows.pipeline import pipeline
from tests.flows.conftest import TINY_BEAM, TINY_MODEL


def _run(bucket: str, cache: str, run_id: str, preflight: PreflightConfig | None):
    return pipeline(source=f"s3://{bucket}/incoming", root=f"s3://{bucket}/stoke", preflight=preflight,
                    preset="demo", train=TrainConfig(**TINY_MODEL), beam_args=TINY_BEAM,
                    gate=GateConfig(min_accuracy=0.0, max_regression=1.0), push=PushConfig(build_image=False),
                    shard_cache=ShardCacheConfig(dir=cache), run_id=run_id, return_state=True)


@pytest.fixture(scope="session")
def bucket_runs(s3_endpoint, tmp_path_factory):
    """Two runs of the flow on one bucket: 40 digits, checked by preflight first, then 20 more (a second
    span; its run skips the checks, which the first showed on a bucket)."""
    bucket = "stoke-flow"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    cache = str(tmp_path_factory.mktemp("shard-cache"))
    write_digits(f"s3://{bucket}/incoming", limit=40)
    first = _run(bucket, cache, "first", PreflightConfig(sample_mb=1))
    write_digits(f"s3://{bucket}/incoming", limit=60)
    second = _run(bucket, cache, "second", None)
    return {"bucket": bucket, "root": f"s3://{bucket}/stoke", "first": first, "second": second}


def test_a_bucket_root_is_trained_gated_and_pushed(bucket_runs):
    state = bucket_runs["first"]
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["status"] == "pushed", summary
    root = Root(bucket_runs["root"])
    run = root.run("first")
    version = summary["pushed_version"]
    assert Repository(root, "stoke").versions()[0] == version  # the second run pushes the next one
    for uri in (run.metrics, run.gate, run.blessed, run.report_json, join_candidate(run)):
        assert fsspec.filesystem("s3").exists(uri), uri
    metrics = read_json(run.metrics)
    assert metrics["staging"]["fetched"] == metrics["staging"]["shards"] > 0
    assert any("read through local copies" in note for note in read_json(run.gate)["notes"])
    assert "MB/s" in read_json(run.report_json)["train"]["shards"]
    preflight = {c["name"]: c for c in read_json(run.result("preflight"))["checks"]}
    assert preflight["shard cache"]["status"] == "ok" and preflight["shard cache"]["facts"]["need_bytes"] == 0

    # saved_model.pb is the last object of the version (and of the candidate) to land in the bucket.
    client = boto3.client("s3")
    for prefix in (f"stoke/models/stoke/{version}/", "stoke/runs/first/candidate/"):
        objects = client.list_objects_v2(Bucket=bucket_runs["bucket"], Prefix=prefix)["Contents"]
        last = max(objects, key=lambda o: o["LastModified"])
        assert last["Key"].endswith("/saved_model.pb") or all(
            o["LastModified"] <= next(p for p in objects if p["Key"].endswith("/saved_model.pb"))["LastModified"]
            for o in objects), prefix

    serving = fsspec.filesystem("s3").cat_file(f"{bucket_runs['bucket']}/stoke/serving/models.bucket.config").decode()
    assert f'base_path: "s3://{bucket_runs["bucket"]}/stoke/models/stoke"' in serving
    assert "-e S3_ENDPOINT" in read_json(f"{root.serving}/commands.json")["bucket"]["docker_run"]


def test_a_second_run_reuses_the_cache_and_compares_with_the_served_version(bucket_runs):
    state = bucket_runs["second"]
    assert state.is_completed(), state.message
    run = Root(bucket_runs["root"]).run("second")
    first = read_json(Root(bucket_runs["root"]).run("first").metrics)["staging"]
    staging = read_json(run.metrics)["staging"]
    assert staging["reused"] == first["shards"]  # span 1's shards were not copied again
    assert staging["fetched"] == staging["shards"] - first["shards"] > 0  # span 2's were
    validation = read_json(run.gate)
    assert validation["served_version"] == bucket_runs["first"].result()["pushed_version"]
    assert validation["baseline_version"] == validation["served_version"]
    # The first version is the reference: its gate recorded its answers, its push kept them in the bucket beside
    # it, and the second run, warm from it, was held to it and names it as the reference of the version it became.
    first, second = validation["served_version"], state.result()["pushed_version"]
    repository = Repository(bucket_runs["root"], "stoke")
    assert read_json(run.metrics)["start"]["kind"] == "warm"
    assert validation["reference"] == {"version": first, "kept": True}
    assert repository.lineage(first).reference == repository.lineage(second).reference == first
    assert repository.answers_uri(first).endswith(f"/{first}/assets.extra/stoke_answers.json.gz")
    assert all(fsspec.filesystem("s3").exists(repository.answers_uri(v)) for v in (first, second))


def join_candidate(run) -> str:
    return f"{run.candidate}/saved_model.pb"


def test_lineage_predict_and_rollback_work_on_the_bucket(bucket_runs, capsys):
    import json

    from components.push import predict, rollback, show_lineage

    root = bucket_runs["root"]
    versions = Repository(root, "stoke").versions()
    image = fsspec.filesystem("s3").find(f"{bucket_runs['bucket']}/incoming")[0]

    assert show_lineage.run([str(versions[0]), "--root", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"] == "first"
    assert predict.run([f"{root}/models/stoke", f"s3://{image}", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["model"].endswith(f"/{versions[-1]}") and answer["predictions"][0]["label"]
    assert len(versions) == 2  # both runs pushed (any drop is allowed): roll the second back
    assert rollback.run(["--root", root, "--reason", "drill", "--json"]) == 0
    capsys.readouterr()
    assert Repository(root, "stoke").versions() == versions[:-1]
    serving = fsspec.filesystem("s3").cat_file(f"{bucket_runs['bucket']}/stoke/serving/models.bucket.config")
    assert f"versions: {versions[-1]}" not in serving.decode()
