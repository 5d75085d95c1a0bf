"""One arrival of hundreds of thousands of small files in one ingest: every file published or set aside,
the progress line within its total, and the driver's memory per arriving file.

    python benchmarks/large_arrival.py [--images 300000] [--also 50000] [--before CHECKOUT] [--folder DIR]

Makes the images first (16x16 JPEGs of noise around one of four colours: distinct files, a few hundred
bytes each, some 2,000 a second), then runs `python -m beam_jobs.ingest` at its defaults (DirectRunner on
this machine's cores, image worker processes) on the first `--also` of them and on all of them, each a
SOURCE folder and ROOT of its own (the smaller one of hard links). For each: wall time, images a second,
the peaks of the process tree's summed RSS and of the driver's own, the counts (records and dead letters
against the files: the job must account for every one), and the progress events (how far the largest
went past its total, and the last). The driver's KB per arriving file is the difference of its peaks
over the difference of the files. With `--before` (a checkout of older code, e.g. `git archive REV | tar
-x -C /tmp/before`), each size runs with that code too, into a ROOT of its own. Memory is capped at 12 GB
(the run is ended there). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.ingest import peak_rss

COLOURS = np.array([[200, 60, 60], [60, 200, 60], [60, 60, 200], [200, 200, 60]])
LIMIT_MB = 12_000


def make_images(folder: Path, count: int, side: int = 16) -> None:
    rng = np.random.default_rng(0)
    for label in range(len(COLOURS)):
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
    for index in range(count):
        pixels = COLOURS[index % len(COLOURS)] + rng.integers(-60, 61, (side, side, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=85)
        (folder / f"class{index % len(COLOURS)}" / f"{index:07d}.jpg").write_bytes(buffer.getvalue())


def first_of(folder: Path, count: int, into: Path) -> None:
    """The first `count` images of `folder` (as make_images numbered them), as hard links under `into`."""
    for index in range(count):
        relative = Path(f"class{index % len(COLOURS)}") / f"{index:07d}.jpg"
        (into / relative.parent).mkdir(parents=True, exist_ok=True)
        os.link(folder / relative, into / relative)


def ingest(source: Path, root: Path, files: int, tree: str | None = None) -> dict:
    """`python -m beam_jobs.ingest --json` of this checkout or of `tree`: its summary, progress and peaks."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree)) if tree else None
    started = time.perf_counter()
    job = subprocess.Popen([sys.executable, "-m", "beam_jobs.ingest", str(source), "--root", str(root), "--json"],
                           stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
    peaks = {}
    watcher = threading.Thread(target=lambda: peaks.setdefault("mb", peak_rss(job, LIMIT_MB)))
    watcher.start()
    out, _ = job.communicate()
    watcher.join()
    seconds = time.perf_counter() - started
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    events = [line for line in lines if line.get("event") == "progress"]
    summary = lines[-1] if lines and "event" not in lines[-1] else {"error": f"no summary (exit code {job.returncode})"}
    counts = summary.get("counts") or {}
    records = counts.get("train", 0) + counts.get("eval", 0)
    (tree_mb, driver_mb) = peaks["mb"]
    return {
        "files": files, "published": summary.get("published", False), "error": summary.get("error"),
        "records": records, "dead_letters": counts.get("dead_letter", 0),
        "every_file_accounted_for": records + counts.get("dead_letter", 0) == files,
        "wall_seconds": round(seconds, 1), "images_per_sec": summary.get("images_per_sec"),
        "peak_tree_mb": round(tree_mb), "peak_driver_mb": round(driver_mb),
        "progress_events": len(events),
        "progress_most_past_total": max((round(e["done"] - e["total"], 1) for e in events), default=None),
        "progress_last": f"{events[-1]['done']} of {events[-1]['total']} {events[-1]['unit']}" if events else None,
    }


def per_file_kb(small: dict, large: dict, key: str) -> float:
    return round((large[key] - small[key]) * 1000 / (large["files"] - small["files"]), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300_000)
    parser.add_argument("--also", type=int, default=50_000, help="a smaller arrival first, for the per-file slope")
    parser.add_argument("--before", help="a checkout of older code to run on each arrival too")
    parser.add_argument("--folder", help="where to make the images and ROOTs (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as work:
        work = Path(work)
        started = time.perf_counter()
        make_images(work / "all", args.images)
        first_of(work / "all", args.also, work / "first")
        result = {"images": args.images, "made_seconds": round(time.perf_counter() - started, 1)}
        for name, tree in [("now", None)] + ([("before", args.before)] if args.before else []):
            small = ingest(work / "first", work / f"root-{name}-first", args.also, tree)
            large = ingest(work / "all", work / f"root-{name}-all", args.images, tree)
            result[name] = {"first": small, "all": large,
                            "driver_kb_per_file": per_file_kb(small, large, "peak_driver_mb"),
                            "tree_kb_per_file": per_file_kb(small, large, "peak_tree_mb")}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
