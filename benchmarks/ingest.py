"""Ingest throughput side by side, in one run, on JPEGs made here.

    python benchmarks/ingest.py [--images 6000] [--size 320x240] [--photos] [--rounds 1]

Measures `stoke ingest` at its defaults (Beam, DirectRunner, one worker thread per core; also with
`--max-side 0`, which keeps full size, and on one worker process per core) against a one-process
`tf.io.TFRecordWriter` loop that only verifies each image and writes its original bytes with GZIP,
and against the machine's limit: the single-core rate of read + verify-decode + compress, times the
cores, once with zlib at level 6 (what TensorFlow's writer does) and once with ISA-L (what Stoke's
writer does). `--rounds N` alternates the job and the loop N times and keeps medians. Peak memory
is the summed RSS of the job's process tree, at half and at all of the images: it should not grow.
The JPEGs are synthetic patterns unless told; `--photos` makes them from the photographs
scikit-image and scikit-learn ship (e.g. `--size 2000x1500`). Prints one JSON object; ratios are
what to compare, since absolute times vary on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import psutil
from isal import isal_zlib

from beam_jobs.sources import list_source
from benchmarks.jpeg_spans import make_camera_photos, make_photos
from components.common.images import normalize
from components.contracts import schema


def peak_rss(process: subprocess.Popen, limit_mb: float | None = None) -> tuple[float, float]:
    """Polls the summed RSS of a process and its children until it exits; returns the peaks in MB of the
    whole tree and of the process alone. Past `limit_mb` it ends them (by their ids), so a run that would
    exhaust a shared machine stops there."""
    peak, alone, parent = 0, 0, psutil.Process(process.pid)
    while process.poll() is None:
        try:
            tree = [parent, *parent.children(recursive=True)]
            sizes = [p.memory_info().rss if p.is_running() else 0 for p in tree]
            peak, alone = max(peak, sum(sizes)), max(alone, sizes[0])
            if limit_mb and peak > limit_mb * 1e6:
                for member in reversed(tree):
                    member.kill()
        except psutil.Error:
            pass
        time.sleep(0.05)
    return peak / 1e6, alone / 1e6


def stoke_ingest(source: Path, root: Path, *beam_args: str, tree: str | None = None,
                 limit_mb: float | None = None) -> dict:
    """`python -m beam_jobs.ingest` of this checkout, or of `tree` (another checkout: its PYTHONPATH and
    working directory, which `-m` puts ahead of PYTHONPATH); ended past `limit_mb` of memory, if given."""
    started, cpu = time.perf_counter(), _children_cpu()
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree)) if tree else None
    job = subprocess.Popen([sys.executable, "-m", "beam_jobs.ingest", str(source), "--root", str(root), "--json",
                            *beam_args], stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
    peak = {}
    watcher = threading.Thread(target=lambda: peak.setdefault("mb", peak_rss(job, limit_mb)[0]))
    watcher.start()
    out, _ = job.communicate()
    watcher.join()
    seconds = time.perf_counter() - started
    if limit_mb and peak["mb"] > limit_mb:
        return {"ended_above_mb": limit_mb, "wall_seconds": round(seconds, 2), "peak_rss_mb": round(peak["mb"])}
    summary = json.loads(out.strip().splitlines()[-1])
    images = summary["counts"]["train"] + summary["counts"]["eval"]
    # images_per_sec is the job's own clock (listing to manifest), as the loop below is timed;
    # the wall clock adds starting Python and importing Beam.
    return {"images": images, "wall_seconds": round(seconds, 2), "seconds": summary["seconds"],
            "images_per_sec": summary["images_per_sec"],
            "wall_images_per_sec": round(images / seconds, 1), "peak_rss_mb": round(peak["mb"]),
            "shards": summary["shards"], "cpu_seconds": round(_children_cpu() - cpu, 2),
            "eval": summary["counts"]["eval"], "near_duplicates": summary.get("near_duplicates")}


def _children_cpu() -> float:
    """CPU seconds (all threads, user + system) of the child processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_process_loop(source: Path, out: Path) -> dict:
    """The plain alternative: one process, TensorFlow's writer, the same verify and normalize."""
    import tensorflow as tf

    started, cpu = time.perf_counter(), time.process_time()
    listing = list_source(str(source), 0.1)
    labels = sorted({s.label for s in listing.sources})
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    writers = {split: tf.io.TFRecordWriter(str(out / f"{split}.tfrecord.gz"), options) for split in schema.SPLITS}
    for s in listing.sources:
        image = normalize(Path(s.uri).read_bytes())
        writers[s.split].write(schema.encode_example(
            encoded=image.encoded, image_format=image.format, height=image.height, width=image.width,
            label=labels.index(s.label), text=s.label, source=s.uri))
    for writer in writers.values():
        writer.close()
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "images_per_sec": round(len(listing.sources) / seconds, 1),
            "cpu_ms_per_image": round(1000 * (time.process_time() - cpu) / len(listing.sources), 2),
            "peak_rss_mb": round(psutil.Process().memory_info().rss / 1e6)}


def machine_limit(source: Path, compress, sample: int = 600) -> dict:
    """Read + verify-decode + compress on one core, times the cores: no framework beats this."""
    files = sorted(source.rglob("*.jpg"))[:sample]
    started = time.perf_counter()
    for path in files:
        compress(normalize(path.read_bytes()).encoded)
    per_core = len(files) / (time.perf_counter() - started)
    cores = os.cpu_count() or 1
    return {"per_core_images_per_sec": round(per_core, 1), "cores": cores,
            "images_per_sec": round(per_core * cores, 1)}


def _median(runs: list[dict]) -> dict:
    """The run with the median rate (its other figures with it)."""
    return sorted(runs, key=lambda r: r["images_per_sec"])[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--size", default="320x240")
    parser.add_argument("--photos", action="store_true", help="JPEGs made from packaged photographs")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of the job and the loop")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    make = make_camera_photos if args.photos else make_photos
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        half, full = tmp / "half", tmp / "full"
        input_bytes = sum(p.stat().st_size for p, _ in make(full, args.images, *size))
        make(half, args.images // 2, *size)
        rounds = {"stoke_ingest": [], "stoke_ingest_full_size": [], "one_process_loop": []}
        for i in range(args.rounds):
            rounds["stoke_ingest"].append(stoke_ingest(full, tmp / f"root-{i}"))
            rounds["stoke_ingest_full_size"].append(stoke_ingest(full, tmp / f"root-full-size-{i}", "--max-side", "0"))
            (tmp / f"loop-{i}").mkdir()
            rounds["one_process_loop"].append(one_process_loop(full, tmp / f"loop-{i}"))
        result = {
            "images": args.images, "size": args.size, "photos": args.photos, "rounds": args.rounds,
            "input_mb": round(input_bytes / 1e6, 1),
            "stoke_ingest_half": stoke_ingest(half, tmp / "root-half"),
            **{key: _median(runs) for key, runs in rounds.items()},
            "stoke_ingest_processes": stoke_ingest(full, tmp / "root-processes",
                                                   "--direct_running_mode=multi_processing"),
            "limit_zlib6": machine_limit(full, lambda data: zlib.compress(data, 6)),
            "limit_isal": machine_limit(full, isal_zlib.compress),
        }
        ingest_rate = result["stoke_ingest"]["images_per_sec"]
        result["ratios"] = {
            "stoke_vs_one_process_loop": round(ingest_rate / result["one_process_loop"]["images_per_sec"], 2),
            "stoke_vs_full_size": round(ingest_rate / result["stoke_ingest_full_size"]["images_per_sec"], 2),
            # The job's CPU time includes starting Python and importing Beam: per image, count the
            # difference between the full and the half run.
            "stoke_cpu_ms_per_image": round(1000 * (result["stoke_ingest"]["cpu_seconds"] - result[
                "stoke_ingest_half"]["cpu_seconds"]) / (args.images - args.images // 2), 2),
            "loop_cpu_ms_per_image": result["one_process_loop"]["cpu_ms_per_image"],
            "stoke_wall_vs_one_process_loop": round(
                result["stoke_ingest"]["wall_images_per_sec"] / result["one_process_loop"]["images_per_sec"], 2),
            "worker_threads_vs_processes": round(
                ingest_rate / result["stoke_ingest_processes"]["images_per_sec"], 2),
            "stoke_vs_limit_zlib6": round(ingest_rate / result["limit_zlib6"]["images_per_sec"], 2),
            "stoke_vs_limit_isal": round(ingest_rate / result["limit_isal"]["images_per_sec"], 2),
            "peak_memory_full_vs_half": round(result["stoke_ingest"]["peak_rss_mb"]
                                              / result["stoke_ingest_half"]["peak_rss_mb"], 2),
        }
        gz = sum(p.stat().st_size for p in (tmp / "root-full-size-0" / "data" / "spans").rglob("*.tfrecord.gz"))
        result["gzip_saving_full_size"] = round(1 - gz / input_bytes, 4)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
