"""Training recipes side by side: the held-out accuracy each reaches, over several seeds.

    python benchmarks/train_recipes.py digits   [--seeds 1,2,3] [--variants default,before,...]
    python benchmarks/train_recipes.py textures [--seeds 1,2,3]

digits: scikit-learn's 1,797 digits at 32 px, 8 epochs, batch 32, no flips (the demo's settings).
textures: 300 noisy 96x96 crops of scikit-image's brick, grass and gravel photos (benchmarks/textures.py),
30% held out, 64 px, 12 epochs, default batch. Each run is `stoke train` on one span; the JSON
gives, per recipe, the final (exported) eval accuracy of every seed, the best epoch's, and medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Flags on top of the defaults of `stoke train`; "default" is the recipe as shipped.
VARIANTS = {
    "before": ["--schedule", "constant", "--weight-decay", "0", "--no-ema"],  # constant Adam, last weights
    "cosine": ["--weight-decay", "0", "--no-ema"],
    "cosine_wd": ["--no-ema"],
    "default": [],
    "no_wd": ["--weight-decay", "0"],
    "wd_1e-2": ["--weight-decay", "0.01"],
    "smoothing_0.1": ["--label-smoothing", "0.1"],
    "lr_1e-3": ["--learning-rate", "0.001"],
    "lr_3e-3": ["--learning-rate", "0.003"],
    "lr_3e-3_no_ema": ["--learning-rate", "0.003", "--no-ema"],
    "lr_1e-2": ["--learning-rate", "0.01"],
    "bfloat16_xla": ["--precision", "mixed_bfloat16", "--xla"],
}
DATASETS = {
    "digits": ["--preset", "demo"],
    "textures": ["--network", "small_cnn", "--weights", "none", "--image-size", "64", "--epochs", "12", "--flip"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", choices=sorted(DATASETS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--variants", default="before,cosine,cosine_wd,default,smoothing_0.1")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="stoke-bench-recipes-") as tmp:
        root = make_span(args.dataset, Path(tmp))
        jobs = [(variant, seed) for variant in variants for seed in seeds]
        with ThreadPoolExecutor(args.parallel) as pool:
            runs = list(pool.map(lambda job: train(root, args.dataset, *job), jobs))
    results = {}
    for variant in variants:
        mine = [r for (v, _), r in zip(jobs, runs) if v == variant and r]
        if not mine:
            results[variant] = "failed"
            continue
        final = [r["eval"]["accuracy"] for r in mine]
        best = [r["best_epoch"]["accuracy"] for r in mine]
        results[variant] = {"final": final, "best_epoch": best, "median_final": statistics.median(final),
                            "min_final": min(final), "median_best_minus_final": statistics.median(
                                b - f for b, f in zip(best, final)), "steps": mine[0]["total_steps"]}
    print(json.dumps({"dataset": args.dataset, "seeds": seeds, "variants": results}, sort_keys=True))
    return 0


def make_span(dataset: str, tmp: Path) -> str:
    root = str(tmp / "root")
    if dataset == "digits":
        from flows.demo import write_digits
        write_digits(str(tmp / "images"))
        fraction = "0.1"
    else:
        from benchmarks.textures import write_textures
        write_textures(tmp / "images")
        fraction = "0.3"
    subprocess.run([sys.executable, "-m", "flows.cli", "ingest", str(tmp / "images"), "--root", root,
                    "--eval-fraction", fraction], check=True, capture_output=True, env=_env())
    return root


def train(root: str, dataset: str, variant: str, seed: int) -> dict | None:
    out = subprocess.run(
        [sys.executable, "-m", "components.train", "--root", root, "--run-id", f"{variant}-{seed}",
         "--seed", str(seed), "--input-probe-steps", "0", "--trace-steps", "none", "--json",
         *DATASETS[dataset], *VARIANTS[variant]], capture_output=True, text=True, env=_env())
    if out.returncode:
        print(f"{variant} seed {seed} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PREFECT_SERVER_ANALYTICS_ENABLED="false")


if __name__ == "__main__":
    sys.exit(main())
