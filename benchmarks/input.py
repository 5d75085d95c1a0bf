"""Input pipeline throughput side by side, in one run, on photo-sized JPEGs made here.

    python benchmarks/input.py [--images 3000] [--source-size 320x240] [--compression gzip] [--image-size 224] [--batches 40]

Runs `stoke bench input` (benchmarks/input_pipeline.py) in its own process, as a user would, over
photo-like JPEGs (320x240 unless told) in class folders and a span of them: Stoke's tf.data pipeline against Keras'
image_dataset_from_directory over the same files, the naive single-map pipeline, and the decode
limit (one thread's decode+resize rate x cores). Prints one JSON object with the rates and the
ratios to compare against the targets (Stoke >= 1.5x Keras, >= 0.8x the limit).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.jpeg_spans import make_photos, write_span


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--source-size", default="320x240", help="WIDTHxHEIGHT of the JPEGs made")
    parser.add_argument("--compression", default="gzip", choices=["gzip", "none"], help="codec of the span's shards")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1, help="runs of the whole comparison; the median is kept")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoke-bench-input-") as tmp:
        source, root = Path(tmp) / "photos", os.path.join(tmp, "root")
        width, height = (int(v) for v in args.source_size.split("x"))
        make_photos(source, args.images, width, height)
        write_span(root, source, compression=args.compression)
        runs = [_bench(source, root, args) for _ in range(args.repeats)]
    keys = sorted(k for k in runs[0] if isinstance(runs[0][k], float))
    result = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in keys}
    result.update({"images": args.images, "source_size": args.source_size, "compression": args.compression,
                   "image_size": args.image_size, "batch_size": args.batch_size, "cores": runs[0]["cores"],
                   "repeats": args.repeats,
                   "targets": {"stoke_vs_keras": 1.5, "stoke_vs_limit": 0.8}})
    print(json.dumps(result, sort_keys=True))
    return 0


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
