"""Training with ROOT in an S3 bucket (moto on 127.0.0.1): shards through the local cache, the
backup, logs and candidate uploaded, resume from the bucket on a fresh cache."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import fsspec
import pytest

from components.common import shard_cache
from components.train import trainer as train
from tests.components.train.test_train import TINY, _env, finish

SHARDS = 4  # span 1 of small_spans_root: 3 train shards, 1 eval shard


@pytest.fixture(scope="module")
def bucket_root(s3_endpoint, small_spans_root):
    """small_spans_root's published span, uploaded to a bucket."""
    fs = fsspec.filesystem("s3")
    fs.mkdir("train-root")
    fs.put(os.path.join(small_spans_root, "data"), "train-root/root/data", recursive=True)
    return "s3://train-root/root"


def _run(capsys, root, cache, *args) -> tuple[int, dict]:
    code = train.run(["--root", root, *TINY, "--no-xla", "--shard-cache-dir", str(cache), "--json", *args])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_training_reads_through_the_cache_and_uploads_the_candidate(bucket_root, tmp_path, capsys):
    # Two epochs, not the cpu preset's 600 steps: the staging and the uploads are the same after any epochs.
    code, summary = _run(capsys, bucket_root, tmp_path, "--run-id", "s3-first", "--epochs", "2")
    assert code == 0, summary
    fs = fsspec.filesystem("s3")
    run = "train-root/root/runs/s3-first"
    assert fs.exists(f"{run}/metrics.json") and fs.exists(f"{run}/candidate/saved_model.pb")
    assert fs.find(f"{run}/tensorboard") and not fs.exists(f"{run}/backup")  # a finished run keeps no backup
    assert summary["staging"]["fetched"] == SHARDS and summary["staging"]["mb_per_sec"] > 0
    assert summary["staging"]["selection"] == "all shards"


def test_a_cache_that_cannot_hold_the_shards_stops_before_training(bucket_root, tmp_path, capsys, monkeypatch):
    code, summary = _run(capsys, bucket_root, tmp_path, "--run-id", "s3-cap", "--shard-cache-max-gb", "0.000001")
    assert code == 1 and "--shard-cache-max-gb" in summary["error"] and "\n" not in summary["error"]

    class Full:
        free = 1000

    monkeypatch.setattr(shard_cache.shutil, "disk_usage", lambda path: Full)
    code, summary = _run(capsys, bucket_root, tmp_path, "--run-id", "s3-full")
    assert code == 1 and "0.0 MB free" in summary["error"] and "--shard-cache-dir" in summary["error"]
    assert "\n" not in summary["error"]
    assert not fsspec.filesystem("s3").exists("train-root/root/runs/s3-full/metrics.json")
    assert not os.path.exists(os.path.join(tmp_path, "runs"))  # nothing trained


def test_a_killed_run_resumes_from_the_bucket_on_a_fresh_cache(bucket_root, tmp_path, capsys):
    args = ["--run-id", "s3-resume", "--epochs", "2", "--backup-every", "2"]
    killed = subprocess.Popen([sys.executable, "-m", "components.train", "--root", bucket_root, *TINY, "--no-xla",
                               "--shard-cache-dir", str(tmp_path / "first"), "--json", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(STOKE_KILL_AT_STEP="7"))
    finish(killed, 240)
    assert killed.returncode == -signal.SIGKILL
    assert fsspec.filesystem("s3").find("train-root/root/runs/s3-resume/backup")

    code, summary = _run(capsys, bucket_root, tmp_path / "second", *args)
    assert code == 0, summary
    assert summary["resumed_from_step"] == 6 and summary["total_steps"] == 12


def test_a_backup_key_that_would_leave_the_local_folder_stops_the_run_in_one_line(bucket_root, tmp_path, capsys):
    """The local run folder is CACHE/runs/<run>-<hash>/: three '..' from its backup is the cache's parent."""
    fs = fsspec.filesystem("s3")
    escaping = "train-root/root/runs/s3-escape/backup/../../../outside/escaped"
    fs.pipe_file("train-root/root/runs/s3-escape/backup/checkpoint", b"pointer")
    # made under the start this run makes, so the run resumes from it
    fs.pipe_file("train-root/root/runs/s3-escape/backup/start.json",
                 json.dumps({"kind": "full", "from_version": None, "lineage": None}).encode())
    fs.pipe_file(escaping, b"attacker")
    code, summary = _run(capsys, bucket_root, tmp_path / "cache", "--run-id", "s3-escape")
    assert code == 1 and escaping in summary["error"] and "\n" not in summary["error"]
    assert not (tmp_path / "outside").exists()
    assert not fs.exists("train-root/root/runs/s3-escape/metrics.json")


def test_a_shard_changed_in_the_bucket_after_publishing_is_not_trained_on(bucket_root, small_spans_root, tmp_path,
                                                                          capsys):
    """The copy is checked as it is fetched: records that read but are not those published stop the run, as
    they do on a local ROOT, rather than being read as if the shard were only damaged."""
    from tests.components.conftest import relabel

    fs = fsspec.filesystem("s3")
    fs.copy("train-root/root/data", "train-root/changed/data", recursive=True)
    local = str(tmp_path / "shard.tfrecord.gz")
    fs.get("train-root/changed/data/spans/span-00001/train-00001-of-00003.tfrecord.gz", local)
    relabel(local, 0)
    fs.put(local, "train-root/changed/data/spans/span-00001/train-00001-of-00003.tfrecord.gz")
    code, summary = _run(capsys, "s3://train-root/changed", tmp_path / "cache", "--run-id", "s3-changed")
    assert code == 1 and "\n" not in summary["error"], summary
    assert summary["error"].startswith("span 1 changed after it was published: s3://train-root/changed/data/spans/"
                                       "span-00001/train-00001-of-00003.tfrecord.gz "), summary["error"]
    assert not fs.exists("train-root/changed/runs/s3-changed/metrics.json")
