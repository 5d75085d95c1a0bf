"""Ingest throughput side by side, in one run, on photo-sized JPEGs made here.

    python benchmarks/ingest.py [--images 6000] [--size 320x240]

Measures `stoke ingest` (Beam, DirectRunner, one worker thread per core, and for comparison one
worker process per core) against a one-process
`tf.io.TFRecordWriter` loop doing the same verify + normalize + GZIP work, and against the machine's
limit: the single-core rate of read + verify-decode + compress, times the cores, once with zlib at
level 6 (what TensorFlow's writer does) and once with ISA-L (what Stoke's writer does). Peak memory
is the summed RSS of the job's process tree, at half and at all of the images: it should not grow.
Prints one JSON object; ratios are what to compare, since absolute times vary on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import psutil
from isal import isal_zlib

from beam_jobs.images import normalize
from beam_jobs.sources import list_source
from benchmarks.jpeg_spans import make_photos
from components.contracts import schema


def peak_rss(process: subprocess.Popen) -> float:
    """Polls the summed RSS of a process and its children until it exits; returns the peak in MB."""
    peak, parent = 0, psutil.Process(process.pid)
    while process.poll() is None:
        try:
            tree = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    return peak / 1e6


def stoke_ingest(source: Path, root: Path, *beam_args: str) -> dict:
    started = time.perf_counter()
    job = subprocess.Popen([sys.executable, "-m", "beam_jobs.ingest", str(source), "--root", str(root), "--json",
                            *beam_args], stdout=subprocess.PIPE, text=True)
    peak = {}
    watcher = threading.Thread(target=lambda: peak.setdefault("mb", peak_rss(job)))
    watcher.start()
    out, _ = job.communicate()
    watcher.join()
    seconds = time.perf_counter() - started
    summary = json.loads(out.strip().splitlines()[-1])
    images = summary["counts"]["train"] + summary["counts"]["eval"]
    # images_per_sec is the job's own clock (listing to manifest), as the loop below is timed;
    # the wall clock adds starting Python and importing Beam.
    return {"images": images, "wall_seconds": round(seconds, 2), "images_per_sec": summary["images_per_sec"],
            "wall_images_per_sec": round(images / seconds, 1), "peak_rss_mb": round(peak["mb"]),
            "shards": summary["shards"]}


def one_process_loop(source: Path, out: Path) -> dict:
    """The plain alternative: one process, TensorFlow's writer, the same verify and normalize."""
    import tensorflow as tf

    started = time.perf_counter()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--size", default="320x240")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        half, full = tmp / "half", tmp / "full"
        input_bytes = sum(p.stat().st_size for p, _ in make_photos(full, args.images, *size))
        make_photos(half, args.images // 2, *size)
        (tmp / "loop").mkdir()
        result = {
            "images": args.images, "size": args.size, "input_mb": round(input_bytes / 1e6, 1),
            "stoke_ingest_half": stoke_ingest(half, tmp / "root-half"),
            "stoke_ingest": stoke_ingest(full, tmp / "root"),
            "stoke_ingest_processes": stoke_ingest(full, tmp / "root-processes",
                                                   "--direct_running_mode=multi_processing"),
            "one_process_loop": one_process_loop(full, tmp / "loop"),
            "limit_zlib6": machine_limit(full, lambda data: zlib.compress(data, 6)),
            "limit_isal": machine_limit(full, isal_zlib.compress),
        }
        ingest_rate = result["stoke_ingest"]["images_per_sec"]
        result["ratios"] = {
            "stoke_vs_one_process_loop": round(ingest_rate / result["one_process_loop"]["images_per_sec"], 2),
            "stoke_wall_vs_one_process_loop": round(
                result["stoke_ingest"]["wall_images_per_sec"] / result["one_process_loop"]["images_per_sec"], 2),
            "worker_threads_vs_processes": round(
                ingest_rate / result["stoke_ingest_processes"]["images_per_sec"], 2),
            "stoke_vs_limit_zlib6": round(ingest_rate / result["limit_zlib6"]["images_per_sec"], 2),
            "stoke_vs_limit_isal": round(ingest_rate / result["limit_isal"]["images_per_sec"], 2),
            "peak_memory_full_vs_half": round(result["stoke_ingest"]["peak_rss_mb"]
                                              / result["stoke_ingest_half"]["peak_rss_mb"], 2),
        }
        gz = sum(p.stat().st_size for p in (tmp / "root" / "data" / "spans").rglob("*.tfrecord.gz"))
        result["gzip_saving"] = round(1 - gz / input_bytes, 4)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
