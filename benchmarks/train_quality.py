"""Is the model the demo pushes its best? The demo flow three times, with three seeds.

    python benchmarks/train_quality.py [--seeds 1,2,3] [--epochs 8] [-- extra `stoke run` options]

Each run is `stoke run` on scikit-learn's digits (flows/demo.py) into a fresh ROOT with the flow's
demo preset and `train.seed=N`, as `make run` does on a fresh clone. Per run: the
pushed model's eval accuracy (TFMA, from gate.json; null when nothing was pushed), the best
epoch's and the final epoch's eval accuracy as training measured them (metrics.json). Target: every
pushed model >= 0.90 and within 0.02 of its best epoch.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from components.common.files import exists, read_result
from components.contracts.layout import Root
from components.contracts.presets import PRESETS
from components.contracts.results import GateResult, TrainMetrics

TARGET = {"min_pushed_accuracy": 0.90, "max_below_best_epoch": 0.02}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=PRESETS["demo"]["train"]["epochs"])
    parser.add_argument("extra", nargs="*", help="more `stoke run` options, after --")
    args = parser.parse_args()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    runs = []
    with tempfile.TemporaryDirectory(prefix="stoke-bench-quality-") as tmp:
        from flows.demo import write_digits

        digits = os.path.join(tmp, "digits")
        write_digits(digits)
        for seed in (int(s) for s in args.seeds.split(",")):
            root = Root(os.path.join(tmp, f"root-{seed}"))
            run = root.run(f"seed-{seed}")
            out = subprocess.run([sys.executable, "-m", "flows.cli", "run", digits, "--root", root.uri,
                                  "--run-id", run.run_id, "--preset", "demo", "--set", f"train.epochs={args.epochs}",
                                  "--set", f"train.seed={seed}", "--no-preflight", "--json", *args.extra],
                                 capture_output=True, text=True, env=env)
            if out.returncode:
                sys.exit(f"stoke run (seed {seed}) failed:\n{out.stderr[-3000:]}")
            metrics = read_result(run.metrics, TrainMetrics)
            gate = read_result(run.gate, GateResult)
            pushed = exists(run.pushed)
            accuracies = metrics.history["val_accuracy"]
            runs.append({
                "seed": seed,
                "pushed": pushed,
                "pushed_eval_accuracy": gate.metrics.accuracy if pushed else None,
                "best_epoch": metrics.best_epoch.epoch,
                "best_epoch_accuracy": metrics.best_epoch.accuracy,
                "final_epoch_accuracy": accuracies[-1],
                "exported_weights": metrics.exported_weights,
                "precision": metrics.precision,
                "total_steps": metrics.total_steps,
            })
    met = all(r["pushed"] and r["pushed_eval_accuracy"] >= TARGET["min_pushed_accuracy"]
              and r["best_epoch_accuracy"] - r["pushed_eval_accuracy"] <= TARGET["max_below_best_epoch"] for r in runs)
    print(json.dumps({"epochs": args.epochs, "runs": runs, "target": TARGET, "target_met": met}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
