"""A new user's first hour, measured: `stoke run` on camera-sized photos, scored on photos it never saw.

    python benchmarks/photos.py [--seeds 1,2,3] [--per-class 40] [--held-out 25] [--size 1600x1200]
                                [--weights PATH] [--only cpu|production]

Makes two photo sets of scikit-image's pictures (benchmarks/photo_sets.py: one class a picture, each
photo a random crop, zoom, exposure and tint at a camera's size): one to run on, one held out. Each run
is `stoke run` (the whole flow, its own Prefect server) into a fresh ROOT; held-out accuracy is the
candidate's serving signature on every held-out JPEG, as TF Serving would answer.

- cpu: `--preset cpu`, once per seed.
- production: the production recipe (pretrained weights; the head, then the backbone) once per seed.
  With `--weights PATH` (keras.applications' efficientnetb0_notop.h5, say), the production preset as
  it is. Without, since no ImageNet weights can be had offline, a mobilenet_v3_small backbone is first
  pretrained here, from scratch, on a third photo set of other pictures (camera, coins, moon, ...),
  and the production recipe fine-tunes it at 128 px; beside it, the same network and epochs from
  scratch. That shows the recipe running end to end and what a backbone that saw other photos buys;
  it does not show what ImageNet's features would reach.

Prints one JSON object: per run, seconds of `stoke run` (its own Prefect server included) and of its
training stage, held-out accuracy, eval accuracy (the gate's), blessed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.photo_sets import OTHER_PICTURES, PICTURES, make_photo_set

PRETRAIN = {"network": "mobilenet_v3_small", "image_size": 128}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--per-class", type=int, default=40, help="photos a class to run on (4 classes)")
    parser.add_argument("--held-out", type=int, default=25, help="held-out photos a class")
    parser.add_argument("--size", default="1600x1200")
    parser.add_argument("--weights", help="an ImageNet *_notop.h5 for the production preset as it is")
    parser.add_argument("--only", choices=("cpu", "production"), help="run one of the two")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="stoke-bench-photos-") as tmp:
        base = Path(tmp)
        make_photo_set(base / "photos", args.per_class, seed=100, size=size)
        make_photo_set(base / "held-out", args.held_out, seed=200, size=size)
        runs = {}
        if args.only != "production":
            runs["cpu"] = [run(base, f"cpu-{s}", ["--preset", "cpu", "--set", f"train.seed={s}"]) for s in seeds]
        if args.only != "cpu":
            runs.update(production(base, seeds, args.weights))
    result = {"photos": {"classes": list(PICTURES), "per_class": args.per_class, "held_out_per_class": args.held_out,
                         "size": args.size}, "cores": os.cpu_count(), "runs": runs,
              "summary": {name: {"median_held_out": statistics.median(r["held_out_accuracy"] for r in mine),
                                 "min_held_out": min(r["held_out_accuracy"] for r in mine),
                                 "median_seconds": statistics.median(r["seconds"] for r in mine),
                                 "median_train_seconds": statistics.median(r["train_seconds"] for r in mine)}
                          for name, mine in runs.items() if mine and not isinstance(mine, dict)}}
    print(json.dumps(result, sort_keys=True))
    return 0


def production(base: Path, seeds: list[int], weights: str | None) -> dict:
    """The production recipe's runs: the preset with an ImageNet file, or a backbone pretrained here."""
    if weights:
        return {"production": [run(base, f"production-{s}", ["--set", f"train.weights={weights}",
                                                             "--set", f"train.seed={s}"]) for s in seeds]}
    started = time.monotonic()
    backbone = pretrain(base)
    pretraining = {"seconds": round(time.monotonic() - started, 1), "pictures": list(OTHER_PICTURES), **PRETRAIN}
    same = ["--set", f"train.network={PRETRAIN['network']}", "--set", f"train.image_size={PRETRAIN['image_size']}"]
    return {
        "pretraining": pretraining,
        "production_pretrained_here": [run(base, f"fine-tuned-{s}", [*same, "--set", f"train.weights={backbone}",
                                                                     "--set", f"train.seed={s}"]) for s in seeds],
        "production_network_from_scratch": [run(base, f"scratch-{s}", [*same, "--set", "train.weights=none",
                                                                       "--set", f"train.seed={s}"]) for s in seeds],
    }


def pretrain(base: Path) -> str:
    """A mobilenet_v3_small backbone trained from scratch on other pictures, saved as keras.applications
    saves its *_notop.h5: the backbone alone."""
    import tensorflow as tf

    from components.common.networks import backbone
    from components.train.models import build_model

    make_photo_set(base / "other", 30, seed=300, size=(800, 600), pictures=OTHER_PICTURES)
    root = base / "pretrain-root"
    _stoke(["ingest", str(base / "other"), "--root", str(root)])
    summary = _stoke(["train", "--root", str(root), "--run-id", "pretrain", "--preset", "cpu", "--min-steps", "1000",
                      "--network", PRETRAIN["network"], "--image-size", str(PRETRAIN["image_size"]),
                      "--input-probe-steps", "0", "--trace-steps", "none", "--seed", "0"])
    trained = {v.name: v.numpy() for v in tf.saved_model.load(summary["model_dir"]).model.variables}
    model = build_model(PRETRAIN["network"], len(OTHER_PICTURES), PRETRAIN["image_size"])
    for variable in model.variables:
        variable.assign(trained[variable.name])
    recalibrate(model, base / "other", PRETRAIN["image_size"])
    path = str(base / "pretrained_mobilenet_v3_small_notop.h5")
    backbone(model).save_weights(path)
    return path


def recalibrate(model, folder: Path, size: int, passes: int = 3) -> None:
    """The backbone's batch-norm moving statistics, recomputed on the photos it was pretrained on:
    keras.applications' MobileNetV3 keeps them with momentum 0.999, so after the few thousand steps a CPU
    affords they still hold much of their initial 0 and 1, and fine-tuning keeps them as they are."""
    import numpy as np
    import tf_keras as keras
    from PIL import Image

    images = np.stack([np.asarray(Image.open(path).convert("RGB").resize((size, size)))
                       for path in sorted(folder.glob("*/*.jpg"))])
    for layer in model.submodules:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.9
    for _ in range(passes):
        for start in range(0, len(images), 16):
            model(images[start:start + 16], training=True)


def run(base: Path, name: str, options: list[str]) -> dict:
    """`stoke run` on the photo set into a fresh ROOT, and the candidate scored on the held-out set."""
    root = base / f"root-{name}"
    started = time.monotonic()
    summary = _stoke(["run", str(base / "photos"), "--root", str(root), "--run-id", name, "--no-preflight",
                      "--set", "push.build_image=false", *options], home=base / f"prefect-{name}")
    seconds = time.monotonic() - started
    folder = root / "runs" / name
    metrics = json.loads((folder / "metrics.json").read_text())
    # The training stage: from the data check's result, the flow's last act before training, to metrics.json,
    # training's last.
    training = (folder / "metrics.json").stat().st_mtime - (folder / "datacheck.json").stat().st_mtime
    return {"seconds": round(seconds, 1), "train_seconds": round(training, 1), "network": metrics["network"],
            "image_size": metrics["image_size"],
            "weights": metrics["weights"], "steps": metrics["total_steps"], "epochs": metrics["epochs"],
            "phases": [(p["name"], p["epochs"]) for p in metrics["phases"]],
            "eval_accuracy": summary["metrics"].get("accuracy"), "blessed": summary["blessed"],
            "held_out_accuracy": held_out(metrics["model_dir"], base / "held-out"), "warnings": metrics["warnings"]}


def held_out(model_dir: str, folder: Path) -> float:
    """Share of the held-out JPEGs whose label the candidate's serving signature names."""
    import tensorflow as tf

    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    right = total = 0
    for label in sorted(p.name for p in folder.iterdir()):
        files = sorted((folder / label).glob("*.jpg"))
        for start in range(0, len(files), 16):
            answers = serve(image_bytes=tf.constant([f.read_bytes() for f in files[start:start + 16]]))["labels"]
            right += sum(answer.decode() == label for answer in answers.numpy())
            total += len(answers)
    return round(right / total, 4)


def _stoke(argv: list[str], home: Path | None = None) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    if home is not None:  # its own ephemeral Prefect server and database, given time to start on busy cores
        env = {k: v for k, v in env.items() if not k.startswith("PREFECT_API")} | {
            "PREFECT_HOME": str(home), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    out = subprocess.run([sys.executable, "-m", "flows.cli", *argv, "--json"], capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"stoke {argv[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
