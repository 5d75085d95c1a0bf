"""Input pipeline throughput side by side, in one run, on JPEGs made here.

    python benchmarks/input.py [--images 3000] [--source-size 320x240] [--photos] [--compression gzip]
                               [--max-side N] [--image-size 224] [--batches 40]

Runs `stoke bench input` (benchmarks/input_pipeline.py) in its own process, as a user would, over
JPEGs in class folders and a span of them written by `stoke ingest` at its defaults (unless told):
Stoke's tf.data pipeline, also with `--image-cache memory`, against Keras' image_dataset_from_directory
over the same files, the naive single-map pipeline, and the decode limit (one thread's
decode+resize rate x cores). The JPEGs are synthetic 320x240 patterns unless told; `--photos`
makes them from the photographs scikit-image and scikit-learn ship, camera-sized with
`--source-size 2000x1500` or `4000x3000`. Prints one JSON object with the rates and the ratios to
compare against the targets (Stoke >= 1.5x Keras, >= 0.8x the limit).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.jpeg_spans import make_camera_photos, make_photos, write_span
from components.common.spans import Spans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--source-size", default="320x240", help="WIDTHxHEIGHT of the JPEGs made")
    parser.add_argument("--photos", action="store_true", help="JPEGs made from packaged photographs")
    parser.add_argument("--compression", default="gzip", choices=["gzip", "none"], help="codec of the span's shards")
    parser.add_argument("--max-side", type=int, default=None, help="ingest's --max-side (default: ingest's default)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1, help="runs of the whole comparison; the median is kept")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoke-bench-input-") as tmp:
        source, root = Path(tmp) / "photos", os.path.join(tmp, "root")
        width, height = (int(v) for v in args.source_size.split("x"))
        (make_camera_photos if args.photos else make_photos)(source, args.images, width, height)
        settings = {} if args.max_side is None else {"max_side": args.max_side}
        write_span(root, source, compression=args.compression, **settings)
        runs = [_bench(source, root, args) for _ in range(args.repeats)]
        inflate = gzip_cost(root, source, os.path.join(tmp, "root-none"), settings) if args.compression == "gzip" else {}
    keys = sorted(k for k in runs[0] if isinstance(runs[0][k], float))
    result = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in keys}
    result.update(inflate)
    result.update({"images": args.images, "source_size": args.source_size, "photos": args.photos,
                   "compression": args.compression, "max_side": args.max_side,
                   "image_size": args.image_size, "batch_size": args.batch_size, "cores": runs[0]["cores"],
                   "repeats": args.repeats,
                   "targets": {"stoke_vs_keras": 1.5, "stoke_vs_limit": 0.8}})
    print(json.dumps(result, sort_keys=True))
    return 0


def gzip_cost(root: str, source: Path, plain: str, settings: dict, rounds: int = 5) -> dict:
    """CPU ms per record to read the GZIP span against the same images ingested uncompressed, in
    alternating rounds (medians): what GZIP costs every epoch."""
    import tensorflow as tf

    write_span(plain, source, compression="none", **settings)
    spans = {"gzip": Spans(root).shards("train", checked=False), "none": Spans(plain).shards("train", checked=False)}
    samples = {key: [] for key in spans}
    for _ in range(rounds):
        for key, shards in spans.items():
            records = tf.data.TFRecordDataset([s.uri for s in shards], shards[0].compression, buffer_size=4 << 20)
            cpu, count = time.process_time(), 0
            for _ in records:
                count += 1
            samples[key].append(1000 * (time.process_time() - cpu) / count)
    ms = {key: sorted(values)[rounds // 2] for key, values in samples.items()}
    entries = [entry for manifest in Spans(plain).manifests(checked=False) for entry in manifest.shards]
    record_bytes = sum(e.bytes for e in entries) / sum(e.records for e in entries)
    return {"read_cpu_ms_per_image_gzip": ms["gzip"], "read_cpu_ms_per_image_none": ms["none"],
            "gzip_cpu_ms_per_image": ms["gzip"] - ms["none"], "record_kb": round(record_bytes / 1e3, 1)}


def _bench(source: Path, root: str, args) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-m", "flows.cli", "bench", "input", str(source), "--root", root,
                          "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
                          "--batches", str(args.batches), "--json"],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"stoke bench input failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
