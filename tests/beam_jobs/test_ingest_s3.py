"""The same ingest from, and into, an s3:// bucket served by moto on 127.0.0.1."""
import gzip
import json
import os
import re
import signal
import subprocess
import sys

import fsspec
import tensorflow as tf

from beam_jobs.ingest import run
from components.contracts import schema
from components.contracts.layout import MANIFEST
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import HANGS_ON_STUCK
from tests.waiting import wait_for


def test_ingest_from_and_into_a_bucket(s3_bucket, tmp_path, capsys):
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    for i in range(4):
        fs.pipe_file(f"{s3_bucket}/photos/cat/{i}.jpg", images.rgb_jpeg(seed=i))
    fs.pipe_file(f"{s3_bucket}/photos/dog/a.png", images.rgba_png())
    fs.pipe_file(f"{s3_bucket}/photos/dog/broken.jpg", images.truncated_jpeg())
    fs.pipe_file(f"{s3_bucket}/photos/dog/README.md", b"sidecar")
    source, root = f"s3://{s3_bucket}/photos", f"s3://{s3_bucket}/root"

    assert run([source, "--root", root, "--json", "--max-bad-fraction", "0.5"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["span_uri"] == f"{root}/data/spans/span-00001"
    fs.invalidate_cache()
    manifest = json.loads(fs.cat_file(f"{summary['span_uri']}/{MANIFEST}"))
    assert manifest["counts"]["train"] + manifest["counts"]["eval"] == 5
    assert {s["uri"] for s in manifest["sources"]} == {
        f"s3://{s3_bucket}/photos/{p}" for p in ("cat/0.jpg", "cat/1.jpg", "cat/2.jpg", "cat/3.jpg",
                                                 "dog/a.png", "dog/broken.jpg")}
    dead = [json.loads(line) for line in fs.cat_file(f"{summary['span_uri']}/dead_letter.jsonl").splitlines()]
    assert [d["uri"] for d in dead] == [f"s3://{s3_bucket}/photos/dog/broken.jpg"]
    assert not fs.glob(f"{root}/data/spans/_staging-*")

    local = tmp_path / "span"
    fs.get(summary["span_uri"] + "/", str(local), recursive=True)
    files = [str(local / s["file"]) for s in manifest["shards"]]
    labels = {int(tf.io.parse_single_example(r, schema.feature_spec())[schema.LABEL])
              for r in tf.data.TFRecordDataset(files, "GZIP")}
    assert labels == {0, 1}

    assert run([source, "--root", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["published"] is False


def test_a_bucket_manifest_reads_only_its_own_folder(s3_bucket, capsys):
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    fs.pipe_file(f"{s3_bucket}/photos/cat/0.jpg", images.rgb_jpeg())
    fs.pipe_file(f"{s3_bucket}/private/key.jpg", images.rgb_jpeg(seed=1))
    fs.pipe_file(f"{s3_bucket}/photos/m.csv", (
        f"cat/0.jpg,cat\ns3://{s3_bucket}/photos/cat/./0.jpg,cat\n../private/key.jpg,cat\n"
        f"s3://{s3_bucket}/private/key.jpg,cat\n/etc/hostname,cat\n").encode())
    root = f"s3://{s3_bucket}/root"
    assert run([f"s3://{s3_bucket}/photos/m.csv", "--root", root, "--json", "--max-bad-fraction", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["train"] + summary["counts"]["eval"] == 1
    outside = f"outside the manifest's folder s3://{s3_bucket}/photos; --allow-outside-source reads it"
    assert {(d["uri"], d["reason"]) for d in summary["dead_letters"]} == {
        (f"s3://{s3_bucket}/private/key.jpg", outside), ("/etc/hostname", outside)}


def test_a_second_ingest_into_a_bucket_waits_its_time_then_is_refused_while_the_first_runs(s3_bucket, tmp_path):
    source, root = tmp_path / "source", f"s3://{s3_bucket}/root"
    (source / "cat").mkdir(parents=True)
    for i in range(3):
        (source / "cat" / f"{i}.jpg").write_bytes(images.rgb_jpeg(seed=i))
    (source / "cat" / "stuck.jpg").write_bytes(images.rgb_jpeg(seed=9))  # its read never ends: the job holds the lease
    first = subprocess.Popen([sys.executable, "-c", HANGS_ON_STUCK, str(source), "--root", root],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fs = fsspec.filesystem("s3")
    try:
        wait_for(lambda: fs.invalidate_cache() or fs.glob(f"{root}/data/spans/_staging-*/sources-*"),
                 "the first job to stage its list", every=0.1, process=first)
        staging = fs.glob(f"{root}/data/spans/_staging-*")
        assert len(staging) == 1, "the first job never staged its list"

        # In a child with a timeout, should an ingest that is not refused hang too.
        second = subprocess.run([sys.executable, "-m", "beam_jobs.ingest", str(source), "--root", root, "--json",
                                 "--wait-minutes", "0.01"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert f"stoke ingest: another ingest is writing into {root} (ingest (pid {first.pid} on " in second.stderr
        assert "waiting up to 0.01 min for it to finish" in second.stderr
        error = json.loads(second.stdout.strip().splitlines()[-1])["error"]
        assert error.startswith(f"another ingest is still writing into {root} after 0.01 min (ingest.wait_minutes); "
                                "run again when it has finished (")
        assert re.search(rf"ingest \(pid {first.pid} on [^)]+\) holds {root}/data/\.ingest\.lock", error), error
        fs.invalidate_cache()
        assert fs.glob(f"{root}/data/spans/_staging-*") == staging  # the first job's staging is untouched
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


def test_a_damaged_content_index_in_a_bucket_is_rebuilt_there_as_ingest_wrote_it(s3_bucket, capsys):
    """The rebuild reads the shards from the bucket, and re-reads a re-encoded record's source there
    (known by its ETag), so re-uploads of every file, the re-encoded one too, are still copies."""
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    for i in range(3):
        fs.pipe_file(f"{s3_bucket}/photos/cat/{i}.jpg", images.rgb_jpeg(seed=i))
    fs.pipe_file(f"{s3_bucket}/photos/dog/a.png", images.rgba_png())  # alpha: re-encoded at ingest
    source, root = f"s3://{s3_bucket}/photos", f"s3://{s3_bucket}/root"
    assert run([source, "--root", root, "--json"]) == 0
    capsys.readouterr()
    index = f"{root}/data/spans/span-00001/content_index.tsv.gz"
    good = fs.cat_file(index)
    fs.pipe_file(index, gzip.compress(b"".join(gzip.decompress(good).splitlines(keepends=True)[::-1])))
    for name in ("cat/0.jpg", "cat/1.jpg", "cat/2.jpg", "dog/a.png"):
        fs.copy(f"{s3_bucket}/photos/{name}", f"{s3_bucket}/again/{name.replace('/', '/copy-')}")

    assert run([f"s3://{s3_bucket}/again", "--root", root, "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert not summary["published"] and summary["duplicates"] == 4, summary
    assert captured.err.startswith(f"stoke: warning: {index}: line 2 is out of order"), captured.err
    fs.invalidate_cache()
    assert fs.cat_file(index) == good
