"""What an ingest costs when almost everything is already published, side by side: a no-op ingest
(nothing new), a 1%-new ingest that lists all of SOURCE, and the same 1% named by notifications
(`--arrived`, what an event-triggered run does), over a ROOT of many published tiny images.

    python benchmarks/listing.py [--files 100000] [--spans 10] [--before CHECKOUT]

With `--before` (a checkout of older code, e.g. `git archive REV | tar -x -C /tmp/before`), every
ingest runs twice, side by side: this code on ROOT and the older code on a copy of ROOT made before
the first run, so both see the same SOURCE and the same published spans.

SOURCE is real: tiny PNG files in 100 class folders. The published spans are synthesized as ingest
would publish them (manifests naming every file with its size and mtime, content indexes with
random SHA-256s, source indexes), so the runs measure listing and comparing, not converting 100,000 images. The new
files are distinct images, so they go through the Beam job and the duplicate lookup. Each ingest
runs in its own process: its peak memory (ru_maxrss) is its own. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from PIL import Image

from beam_jobs.sources import list_source
from components.common.content_index import write_index
from components.common.files import write_json
from components.common.spans import Spans
from components.contracts.layout import Root
from components.contracts.results import SpanManifest

BEAM = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def png(seed: int) -> bytes:
    image = Image.frombytes("RGB", (8, 8), random.Random(seed).randbytes(8 * 8 * 3))  # noise: never blank
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def write_files(source: str, first: int, count: int) -> None:
    for number in range(first, first + count):
        folder = os.path.join(source, f"class-{number % 100:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{number:08d}.png"), "wb") as f:
            f.write(png(number))


def publish_all(source: str, root: str, spans: int) -> None:
    """Spans whose manifests name every file of SOURCE, as ingest would have published them."""
    from beam_jobs.source_index import identity, write_source_index  # not in the code `--before` runs

    listed = list_source(source, 0.1).sources
    per_span, rng = -(-len(listed) // spans), random.Random(0)
    for number in range(1, spans + 1):
        part = listed[(number - 1) * per_span:number * per_span]
        os.makedirs(Root(root).span(number), exist_ok=True)
        write_source_index(Root(root).source_index(number), (identity(s.uri, s.size, s.version) for s in part))
        write_index(Root(root).content_index(number), [
            {"uri": s.uri, "sha256": f"{rng.getrandbits(256):064x}", "dhash": f"{rng.getrandbits(64):016x}",
             "label": s.label, "split": s.split} for s in part])
        write_json(Root(root).manifest(number), SpanManifest(span=number, created="2026-12-01T00:00:00Z", source=source,
                     counts={"train": len(part), "eval": 0, "dead_letter": 0, "duplicates": 0},
                     labels=[f"class-{i:02d}" for i in range(100)],
                     shards=[{"file": "train-00000-of-00001.tfrecord.gz", "split": "train", "records": len(part),
                              "bytes": 0}],  # never read, but the content index is checked against its count
                     sources=[{"uri": s.uri, "size": s.size, "version": s.version} for s in part],
                     ).to_json())
    with open(Root(root).labels, "w") as f:
        json.dump([f"class-{i:02d}" for i in range(100)], f)


def measure(source: str, root: str, arrived: str | None) -> dict:
    """In a process of its own: one ingest, its time and peak memory."""
    from beam_jobs.ingest import ingest
    from components.contracts.run_config import RunConfig

    started = time.perf_counter()
    summary = ingest(RunConfig(source=source, root=root), BEAM, progress=lambda event: None, arrived=arrived)
    return {"seconds": round(time.perf_counter() - started, 2),
            "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "published": summary.published, "new_sources": summary.new_sources}


def run(source: str, root: str, arrived: str | None = None, code: str | None = None) -> dict:
    child = subprocess.run([sys.executable, __file__, "--measure", source, root, arrived or ""],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": code or os.getcwd()})
    if child.returncode:
        raise SystemExit(child.stderr.strip().splitlines()[-1])
    return json.loads(child.stdout.strip().splitlines()[-1])


def side_by_side(source: str, root: str, before: str | None, arrived: str | None = None) -> dict:
    """This code's ingest, and with `before` the older code's on its own copy of ROOT."""
    result = {"now": run(source, root, arrived)}
    if before:
        result["before"] = run(source, f"{root}-before", arrived, before)
        result["memory_ratio_before_vs_now"] = round(result["before"]["peak_mb"] / result["now"]["peak_mb"], 2)
    return result


def without_indexes(root: str) -> str:
    """A copy of ROOT whose spans have no source index, as spans published before them."""
    copy = f"{root}-unindexed"
    shutil.copytree(root, copy)
    for number in Spans(copy).published():
        os.remove(Root(copy).source_index(number))
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--spans", type=int, default=10)
    parser.add_argument("--before", help="a checkout of older code to run side by side on a copy of ROOT")
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure[:2], args.measure[2] or None)))
        return
    with tempfile.TemporaryDirectory() as folder:
        source, root = os.path.join(folder, "source"), os.path.join(folder, "root")
        started = time.perf_counter()
        write_files(source, 0, args.files)
        publish_all(source, root, args.spans)
        result = {"published_files": args.files, "spans": args.spans, "build_seconds": round(time.perf_counter() - started)}
        if args.before:
            shutil.copytree(root, f"{root}-before")
        result["no_op_spans_without_indexes"] = run(source, without_indexes(root))  # builds them, once
        result["no_op"] = side_by_side(source, root, args.before)
        new = args.files // 100
        write_files(source, args.files, new)
        result["one_percent_new_listed"] = side_by_side(source, root, args.before)
        write_files(source, args.files + new, new)
        arrived = os.path.join(folder, "arrived.txt")
        with open(arrived, "w") as f:
            f.writelines(f"{os.path.realpath(source)}/class-{n % 100:02d}/{n:08d}.png\n"
                         for n in range(args.files + new, args.files + 2 * new))
        result["one_percent_new_announced"] = side_by_side(source, root, args.before, arrived)
        result["time_ratio_listed_vs_announced"] = round(result["one_percent_new_listed"]["now"]["seconds"]
                                                         / result["one_percent_new_announced"]["now"]["seconds"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
