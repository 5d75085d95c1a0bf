"""The duplicate lookup against published spans, side by side: an arrival that is all known (a
re-upload) and one with 1% new pictures, against spans holding 300,000 records.

    python benchmarks/duplicates.py [--records 300000] [--spans 10] [--arrival 30000]

The published spans are synthesized, not ingested: each gets the content index and manifest that
ingest writes (random SHA-256s and dHashes, sorted as ingest sorts them), which is all the lookup
reads; ingesting 300,000 images would measure the Beam job instead. Each arrival runs
`beam_jobs.duplicates.find` in its own process, so its peak memory (ru_maxrss, less the process's
RSS before the lookup) is its own. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

import psutil

from beam_jobs.duplicates import find
from components.common.content_index import write_index
from components.common.files import write_json
from components.contracts.layout import Root
from components.contracts.results import SpanManifest


def signature(rng: random.Random, number: int, split: str | None = None) -> dict:
    return {"uri": f"s3://bucket/photos/{number:08d}.jpg", "sha256": f"{rng.getrandbits(256):064x}",
            "dhash": f"{rng.getrandbits(64):016x}", "label": f"class-{number % 100}",
            "split": split or ("eval" if rng.random() < 0.1 else "train"), "file": "x", "index": number}


def shard_entries(part: list[dict]) -> list[dict]:
    """A manifest's shard list for these records: never read, but the index is checked against its counts."""
    return [{"file": f"{split}-00000-of-00001.tfrecord.gz", "split": split, "bytes": 0, "sha256": "0" * 64,
             "records": sum(s["split"] == split for s in part)} for split in ("train", "eval")]


def build_root(root: str, records: int, spans: int, rng: random.Random) -> list[dict]:
    """Published spans of `records` records in all; returns every published signature."""
    published = [signature(rng, n) for n in range(records)]
    per_span = -(-records // spans)
    for number in range(1, spans + 1):
        part = published[(number - 1) * per_span:number * per_span]
        os.makedirs(Root(root).span(number), exist_ok=True)
        write_index(Root(root).content_index(number), part)
        write_json(Root(root).manifest(number), SpanManifest(span=number, created="2026-12-01T00:00:00Z", source="s3://bucket/photos",
                     counts={"train": sum(s["split"] == "train" for s in part),
                             "eval": sum(s["split"] == "eval" for s in part), "dead_letter": 0, "duplicates": 0},
                     labels=[f"class-{i}" for i in range(100)], shards=shard_entries(part),
                     sources=[]).to_json())
    return published


def arrival(published: list[dict], size: int, new_share: float, rng: random.Random) -> list[dict]:
    """`size` records re-uploaded under new names, `new_share` of them new pictures."""
    known = rng.sample(published, size - int(size * new_share))
    fresh = [signature(rng, 10**7 + n) for n in range(int(size * new_share))]
    return [{**s, "uri": s["uri"].replace("photos", "again")} for s in known] + fresh


def measure(root: str, arrival_file: str) -> dict:
    """In a process of its own: one lookup, its time and its peak memory above what it started with."""
    with open(arrival_file) as f:
        signatures = [json.loads(line) for line in f]
    before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    found = find(signatures, Root(root))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KB on Linux
    return {"seconds": round(seconds, 3), "peak_mb_above_start": round((peak - before) / 1e6, 1),
            "records_per_sec": round(len(signatures) / seconds), "kept": len(found.kept),
            "dropped": len(found.dropped), "near_duplicates": found.near.count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--spans", type=int, default=10)
    parser.add_argument("--arrival", type=int, default=30_000)
    parser.add_argument("--measure", nargs=2, metavar=("ROOT", "ARRIVAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as folder:
        root = os.path.join(folder, "root")
        started = time.perf_counter()
        published = build_root(root, args.records, args.spans, rng)
        built = time.perf_counter() - started
        index_mb = sum(os.path.getsize(Root(root).content_index(n)) for n in range(1, args.spans + 1)) / 1e6
        result = {"published_records": args.records, "spans": args.spans, "arrival": args.arrival,
                  "index_mb": round(index_mb, 1), "build_seconds": round(built, 1)}
        for name, share in (("all_known", 0.0), ("one_percent_new", 0.01)):
            path = os.path.join(folder, f"{name}.jsonl")
            with open(path, "w") as f:
                f.writelines(json.dumps(s) + "\n" for s in arrival(published, args.arrival, share, rng))
            child = subprocess.run([sys.executable, __file__, "--measure", root, path], check=True,
                                   capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
            result[name] = json.loads(child.stdout.strip().splitlines()[-1])
        result["time_ratio_1pct_new_vs_all_known"] = round(
            result["one_percent_new"]["seconds"] / result["all_known"]["seconds"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
