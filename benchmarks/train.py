"""Training on real data against the same model on a synthetic in-memory batch, in one run.

    python benchmarks/train.py [--images 2000] [--image-size 224] [--batch-size 32] [--steps 40]

Runs `stoke train` with small_cnn over a span of 320x240 JPEGs made here. The run itself reports
the step time on real data (steady state, from the fit) and on one batch held in memory (the
input-bound probe); the ratio synthetic/real step time is the share of model speed that real
input keeps (target >= 0.9 where the model is the bottleneck). On a CPU-only machine the decode
threads and the model share the same cores, so this is the harsh case; on a GPU host the model
runs on the accelerator and the input pipeline has the CPU to itself.
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
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40, help="training steps (one epoch)")
    parser.add_argument("--network", default="small_cnn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoke-bench-train-") as tmp:
        root = os.path.join(tmp, "root")
        make_photos(Path(tmp) / "photos", args.images)
        write_span(root, Path(tmp) / "photos")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        out = subprocess.run(
            [sys.executable, "-m", "flows.cli", "train", "--root", root, "--network", args.network, "--weights", "none",
             "--image-size", str(args.image_size), "--batch-size", str(args.batch_size), "--epochs", "1",
             "--steps-per-epoch", str(args.steps), "--input-probe-steps", str(args.steps), "--run-id", "bench",
             "--json"], capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"stoke train failed:\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    probe = summary["input"]
    print(json.dumps({
        "model": args.network, "image_size": args.image_size, "batch_size": args.batch_size,
        "steps": summary["total_steps"], "precision": summary["precision"], "xla": summary["xla"],
        "real_images_per_sec": summary["images_per_sec"],
        "synthetic_images_per_sec": probe["model_images_per_sec_synthetic"],
        "input_only_images_per_sec": probe["input_images_per_sec"],
        "real_vs_synthetic": probe["real_vs_synthetic"],
        "input_bound": probe["input_bound"],
        "input_wait_seconds": probe["input_wait_seconds"],
        "target": {"real_vs_synthetic": 0.9},
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
