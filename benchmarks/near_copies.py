"""Near-copies: the lookup against published spans beside today's exact one, what moving a record
between staged shards costs, where dHash stops telling pictures apart, and whole ingests of pictures
alike at 9x8 beside distinct ones, this tree beside an earlier commit.

    python benchmarks/near_copies.py [--records 300000] [--spans 10] [--arrival 30000] [--shard-mb 128]
    python benchmarks/near_copies.py --ingest --before COMMIT [--sizes 6000,12000,24000] [--limit-mb 8000]

- ingest (`--ingest`): for each size, JPEGs of 320x240 that are alike at 9x8 (one gradient in a random
  colour each, with sensor noise: what a fixed camera sees) and distinct ones (benchmarks/jpeg_spans.py's
  synthetic photos), each ingested by the commit and by this tree in turn (in alternating order), in a
  process of its own: wall time, peak memory of its process tree, eval records and near-copies. A run
  past `--limit-mb` is ended there (the earlier commit's grow with the square of an alike arrival).

- lookup: over the published spans benchmarks/duplicates.py synthesizes (random dHashes), in a process
  of its own each: the exact lookup (beam_jobs.duplicates.find), staging the published dHashes
  (near_copies.stage_published), a worker loading them and matching every arrival record (Published),
  and the driver settling the arrival among itself (near_copies.arrange); time and peak memory above start.
- moving: the cost of one moved record: a staged shard of --shard-mb rewritten without it, beside
  writing it the first time.
- sizes: false matches among distinct pictures (the 8x8 digits; 64 px tiles of the packaged photos
  shrunk to each size) within 4 and 6 bits, and the distances of real copies of 320x240 photo crops.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from beam_jobs.duplicates import find
from beam_jobs.near_copies import arrange, stage_published
from beam_jobs.near_lookup import NearRules, Published
from beam_jobs.shards import RecordFile, rearrange
from benchmarks.duplicates import arrival, build_root
from benchmarks.ingest import stoke_ingest
from benchmarks.jpeg_spans import make_alike_photos, make_photos
from components.contracts.layout import Root


def measure(step: str, root: str, arrival_file: str) -> dict:
    with open(arrival_file) as f:
        signatures = [json.loads(line) for line in f]
    for s in signatures:
        s.update({"mirror": f"{random.getrandbits(64):016x}", "width": 320, "height": 240,
                  "blocks": base64.b64encode(random.randbytes(192)).decode()})
    before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    if step == "exact":
        find(signatures, Root(root))
    elif step == "stage":
        stage_published(Root(root), os.path.dirname(arrival_file))
    elif step == "worker":
        published = Published(os.path.join(os.path.dirname(arrival_file), "near-published.npz"), 6)
        loaded = time.perf_counter() - started
        matched = sum(published.match(s["dhash"], s["mirror"]) is not None for s in signatures)
    elif step == "arrange":
        arrange(signatures, NearRules("follow", 6, 16), None)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {"seconds": round(seconds, 3), "peak_mb_above_start": round((peak - before) / 1e6, 1)}
    if step == "worker":
        result.update({"load_seconds": round(loaded, 3), "index_mb": round(published.index.nbytes / 1e6, 1),
                       "match_us_per_record": round((seconds - loaded) / len(signatures) * 1e6, 1), "matched": matched})
    return result


def moving(folder: str, shard_mb: int) -> dict:
    record = os.urandom(60_000)  # about a 512 px JPEG: entropy-coded, as incompressible as random bytes
    count = shard_mb * 1024 * 1024 // len(record)
    started = time.perf_counter()
    shard = RecordFile(os.path.join(folder, "train-x.part"), "gzip")
    for _ in range(count):
        shard.write(record)
    staged = {"split": "train", **shard.close()}
    written = time.perf_counter() - started
    started = time.perf_counter()
    moved = {"file": staged["file"], "index": 0, "split": "eval"}
    rearrange([staged], [], [moved], "gzip", folder, shard_mb * 1024 * 1024)
    return {"shard_mb": shard_mb, "records": count, "write_seconds": round(written, 2),
            "rewrite_to_move_one_seconds": round(time.perf_counter() - started, 2)}


def sizes() -> dict:
    from PIL import Image
    from sklearn.datasets import load_digits

    from benchmarks.jpeg_spans import packaged_photos
    from components.common.signatures import pixels_of

    def twins(pictures, bits):
        hashes = np.array([int(pixels_of(p).dhash, 16) for p in pictures], dtype=np.uint64)
        found = np.zeros(len(hashes), bool)
        for i in range(len(hashes)):
            near = np.bitwise_count(hashes[i] ^ hashes[i + 1:]) <= bits
            found[i] |= near.any()
            found[i + 1:] |= near
        return round(float(found.mean()), 3)

    digits = [Image.fromarray((d * 255 / 16).astype(np.uint8)).convert("RGB") for d in load_digits().images]
    tiles = [Image.fromarray(p[y:y + 64, x:x + 64]) for p in packaged_photos()
             for y in range(0, p.shape[0] - 63, 64) for x in range(0, p.shape[1] - 63, 64)]
    result = {"digits_8px_with_a_twin": {b: twins(digits, b) for b in (4, 6)},
              "digits_32px_with_a_twin": {b: twins([d.resize((32, 32), Image.BILINEAR) for d in digits], b) for b in (4, 6)}}
    for side in (6, 8, 12, 16, 32, 64):
        result[f"photo_tiles_{side}px_with_a_twin"] = {b: twins([t.resize((side, side), Image.BOX) for t in tiles], b)
                                                      for b in (4, 6)}
    result["photo_tiles"] = len(tiles)
    return result


def ingests(before: str, sizes: list[int], limit_mb: float) -> dict:
    """Each size of alike and of distinct pictures through the ingest of `before` and of this tree."""
    repo = Path(__file__).resolve().parents[1]
    found: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="stoke-bench-near-") as tmp:
        tmp = Path(tmp)
        earlier = tmp / "before"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(earlier), before],
                       check=True, capture_output=True)
        try:
            for kind, make in (("alike", make_alike_photos), ("distinct", make_photos)):
                for size in sizes:
                    source = tmp / f"{kind}-{size}"
                    make(source, size, 320, 240, classes=2)
                    runs = {}
                    for name in ("before", "now") if len(found) % 2 == 0 else ("now", "before"):
                        os.sync()  # what making the images wrote goes to disk now, not during a run
                        tree = str(earlier if name == "before" else repo)
                        runs[name] = stoke_ingest(source, tmp / f"root-{kind}-{size}-{name}", tree=tree,
                                                  limit_mb=limit_mb)
                        shutil.rmtree(tmp / f"root-{kind}-{size}-{name}", ignore_errors=True)
                    shutil.rmtree(source)
                    found[f"{kind} {size}"] = {name: _brief(run) for name, run in runs.items()}
                    print(json.dumps({f"{kind} {size}": found[f"{kind} {size}"]}), file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(earlier)], check=False)
    return {"before": before, "limit_mb": limit_mb, "cores": os.cpu_count(), "runs": found}


def _brief(run: dict) -> dict:
    near = run.get("near_duplicates") or {}
    return {key: run[key] for key in ("wall_seconds", "peak_rss_mb", "ended_above_mb", "images", "eval") if key in run} \
        | ({"near_copies": near.get("count"), "moved": near.get("moved"), "crowded": near.get("crowded")} if near else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--spans", type=int, default=10)
    parser.add_argument("--arrival", type=int, default=30_000)
    parser.add_argument("--shard-mb", type=int, default=128)
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--ingest", action="store_true", help="whole ingests of alike and distinct pictures")
    parser.add_argument("--before", default="HEAD~1", help="the earlier commit (--ingest)")
    parser.add_argument("--sizes", default="6000,12000,24000", help="images per ingest (--ingest)")
    parser.add_argument("--limit-mb", type=float, default=8000, help="end a run past this memory (--ingest)")
    args = parser.parse_args()
    if args.ingest:
        print(json.dumps(ingests(args.before, [int(v) for v in args.sizes.split(",")], args.limit_mb), indent=1))
        return
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    rng = random.Random(0)
    result = {"published_records": args.records, "spans": args.spans, "arrival": args.arrival}
    with tempfile.TemporaryDirectory() as folder:
        root = os.path.join(folder, "root")
        published = build_root(root, args.records, args.spans, rng)
        path = os.path.join(folder, "arrival.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in arrival(published, args.arrival, 0.01, rng))
        for step in ("exact", "stage", "worker", "arrange"):
            child = subprocess.run([sys.executable, __file__, "--measure", step, root, path], check=True,
                                   capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
            result[step] = json.loads(child.stdout.strip().splitlines()[-1])
        result["moving"] = moving(folder, args.shard_mb)
    result["sizes"] = sizes()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
