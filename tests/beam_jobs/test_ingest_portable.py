"""The ingest job on Beam's portable path: the Runner API job service and SDK harnesses in separate
worker processes, over the Fn API, which is how Flink, Spark and Dataflow v2 run it. SOURCE and ROOT
are in a bucket (moto on 127.0.0.1), as they must be on a cluster: the workers reach nothing of
the driver's but what the bucket holds."""
import gzip
import json
import os
import subprocess
import sys

import fsspec
import pytest
import tensorflow as tf

from beam_jobs.ingest import run
from components.common import processes
from components.contracts.layout import DEAD_LETTER, MANIFEST
from tests.beam_jobs import images
from tests.waiting import free_port, listening, wait_for


@pytest.fixture(scope="module")
def worker_pool(s3_endpoint, tmp_path_factory):
    """`python -m apache_beam.runners.worker.worker_pool_main`, as docs/scale-out.md shows it: it starts each
    SDK harness as a `python` process of its own, so the venv's python comes first on PATH."""
    port = free_port()
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    log = tmp_path_factory.mktemp("worker_pool") / "log"
    pool = processes.start([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                            f"--service_port={port}"], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    wait_for(lambda: listening(port), "the worker pool to listen", every=0.2, process=pool)
    yield port, log
    processes.stop(pool, grace=30)  # the pool and every harness it started: one process group


def span_contents(span_uri: str) -> dict:
    """Every record of a span by source (label, split, image bytes), its manifest and dead letters."""
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    manifest = json.loads(fs.cat_file(f"{span_uri}/{MANIFEST}"))
    records = {}
    for shard in manifest["shards"]:
        data, offset = gzip.decompress(fs.cat_file(f"{span_uri}/{shard['file']}")), 0
        while offset < len(data):
            length = int.from_bytes(data[offset:offset + 8], "little")
            example = tf.train.Example.FromString(data[offset + 12:offset + 12 + length])
            offset += 16 + length
            feature = example.features.feature
            records[feature["image/source"].bytes_list.value[0].decode()] = (
                shard["split"], feature["image/class/label"].int64_list.value[0],
                feature["image/class/text"].bytes_list.value[0].decode(), feature["image/encoded"].bytes_list.value[0])
    dead = [json.loads(line) for line in fs.cat_file(f"{span_uri}/{DEAD_LETTER}").splitlines()]
    return {"records": records, "dead": sorted(d["uri"] for d in dead), "labels": manifest["labels"],
            "counts": manifest["counts"], "sources": sorted((s["uri"], s["size"], s["version"]) for s in manifest["sources"])}


def test_portable_runner_with_worker_processes_publishes_what_the_direct_runner_does(
        s3_bucket, worker_pool, capsys):
    fs = fsspec.filesystem("s3")
    for i in range(6):
        fs.pipe_file(f"{s3_bucket}/photos/cat/{i}.jpg", images.rgb_jpeg(seed=i))
    fs.pipe_file(f"{s3_bucket}/photos/dog/alpha.png", images.rgba_png())
    fs.pipe_file(f"{s3_bucket}/photos/dog/cmyk.jpg", images.cmyk_jpeg())
    fs.pipe_file(f"{s3_bucket}/photos/dog/broken.jpg", images.truncated_jpeg())
    source = f"s3://{s3_bucket}/photos"
    common = [source, "--json", "--max-bad-fraction", "0.5", "--eval-fraction", "0.3", "--shard-mb", "0.01",
              "--near-copies", "report"]  # the synthetic pictures are near-copies: keep their splits by hash
    port, pool_log = worker_pool

    spans, events = {}, {}
    for name, runner in [("direct", []), ("portable", ["--runner=PortableRunner", "--job_endpoint=embed",
                                                       "--environment_type=EXTERNAL",
                                                       f"--environment_config=localhost:{port}"])]:
        assert run([*common, "--root", f"s3://{s3_bucket}/{name}", *runner]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        spans[name], events[name] = span_contents(lines[-1]["span_uri"]), [line for line in lines if "event" in line]

    direct, portable = spans["direct"], spans["portable"]
    harnesses = [line for line in open(pool_log) if "Starting worker with command" in line]
    assert harnesses  # an SDK harness process of the pool's did the work, not this one
    assert len(portable["records"]) == 8 and portable["dead"] == [f"{source}/dog/broken.jpg"]
    assert {split for split, *_ in portable["records"].values()} == {"train", "eval"}
    assert portable == direct
    # Progress is counted where the sources are converted: in this process for DirectRunner, whose last event
    # counts them all; in the harness processes for the portable runner, which shows its own (none here).
    assert events["direct"] and events["direct"][-1]["done"] == events["direct"][-1]["total"]
    assert events["portable"] == []
    assert not fs.glob(f"s3://{s3_bucket}/portable/data/spans/_staging-*")
