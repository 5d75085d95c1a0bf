"""The label check on real digits: how many mis-sorted files it finds (recall), how many of its flags are
mis-sorted files (precision), and what it costs per image.

    python benchmarks/label_errors.py [--seeds 1,2,3] [--train 1000] [--arrival 400] [--moved 20] [--epochs 8]

scikit-learn's handwritten digits (flows/demo.py) as PNG files in class folders: the first `--train`
are ingested (the real Beam job) and a small_cnn at 32 px is trained on them, gated and pushed, as
the demo preset does; then, per seed, `--arrival` of the other digits arrive with `--moved` of them in
a wrong class folder (chosen at random), are ingested as the next span and checked by `stoke
datacheck`. A flag on a file that was not moved counts as a false alarm, though it may be one of the
digits' own label errors. Cost: the label check's seconds (reading, predicting, judging, drawing the
sheet) per record, beside the data check's other checks on the same span (`--model-name` naming no
model, so the label check is skipped). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from beam_jobs.ingest import run as ingest
from components.common.spans import Spans
from components.contracts.run_config import RunConfig
from components.datacheck.datacheck import check_spans
from components.gate.gate import gate
from components.push.push import push
from components.train import trainer
from flows.demo import NAMES, write_digits

BEAM = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def ingested(source: str, root: str) -> bool:
    """The real ingest job; what it prints for people goes to stderr, so stdout holds the one JSON object."""
    with contextlib.redirect_stdout(sys.stderr):
        return ingest([source, "--root", root, *BEAM]) == 0


def digits(folder: str) -> list[tuple[str, str]]:
    """(path, class) of every digit, in the order of the dataset."""
    found = [(os.path.join(folder, name, f), name) for name in NAMES for f in os.listdir(os.path.join(folder, name))]
    return sorted(found, key=lambda item: os.path.basename(item[0]))


def place(files: list[tuple[str, str]], source: str) -> None:
    for path, name in files:
        os.makedirs(os.path.join(source, name), exist_ok=True)
        shutil.copy(path, os.path.join(source, name, os.path.basename(path)))


def served_root(tmp: str, pool: list, train: int, epochs: int) -> str:
    """ROOT with span 1 (the first `train` digits) and a model trained on it, gated and pushed."""
    root, source = os.path.join(tmp, "root"), os.path.join(tmp, "source")
    place(pool[:train], source)
    if not ingested(source, root):
        sys.exit("ingest of the training digits failed")
    check_spans(RunConfig(root=root))
    config = RunConfig.model_validate({"root": root, "train": {
        "network": "small_cnn", "weights": "none", "image_size": 32, "batch_size": 32, "epochs": epochs, "seed": 1,
        "precision": "float32", "xla": False, "input_probe_steps": 0}}).resolved()
    with contextlib.redirect_stdout(sys.stderr):  # Keras' progress, for people
        trainer.train(config, run_id="served")
        verdict = gate(config, run_id="served")
        if not verdict["blessed"]:
            sys.exit(f"the model was not blessed: {verdict['reasons']}")
        push(config, run_id="served")
    return root


def arrival(tmp: str, root: str, pool: list, seed: int, count: int, moved: int) -> tuple[str, set[str]]:
    """A copy of ROOT with the next span: `count` digits, `moved` of them in a wrong folder."""
    rng = np.random.default_rng(seed)
    picked = [pool[i] for i in rng.choice(len(pool), size=count, replace=False)]
    wrong = set(rng.choice(count, size=moved, replace=False).tolist())
    files = [(path, NAMES[(NAMES.index(name) + 1 + rng.integers(len(NAMES) - 1)) % len(NAMES)] if i in wrong else name)
             for i, (path, name) in enumerate(picked)]
    copy, source = os.path.join(tmp, f"root-{seed}"), os.path.join(tmp, f"source-{seed}")
    shutil.copytree(root, copy)
    place(files, source)
    if not ingested(source, copy):
        sys.exit(f"ingest of arrival {seed} failed")
    return copy, {os.path.join(source, name, os.path.basename(path)) for i, (path, name) in enumerate(files) if i in wrong}


def timed(root: str, number: int, model_name: str):
    """The data check of span `number` again, and its wall and CPU seconds (CPU: every thread of the process)."""
    wall, cpu = time.monotonic(), time.process_time()
    (span,) = check_spans(RunConfig(root=root, model_name=model_name), span=number).spans
    return span, time.monotonic() - wall, time.process_time() - cpu


def measure(root: str, moved: set[str], seed: int) -> dict:
    number = Spans(root).published()[-1]
    span, wall, cpu = timed(root, number, "stoke")
    _, other_wall, other_cpu = timed(root, number, "none")  # the other checks alone: no model of that name
    labels = span.label_check
    flagged = {a.file for a in span.anomalies if a.kind == "label_error" and a.file is not None}
    found = len(flagged & moved)
    return {"seed": seed, "records": labels.checked, "moved": len(moved), "flagged": len(flagged), "found": found,
            "false_alarms": len(flagged - moved), "precision": round(found / len(flagged), 3) if flagged else None,
            "recall": round(found / len(moved), 3), "status": span.status, "expected_rate": labels.expected_rate,
            "p_value": labels.p_value, "label_check_seconds": labels.seconds,
            "label_check_ms_per_image": round(1000 * (wall - other_wall) / labels.checked, 2),
            "label_check_cpu_ms_per_image": round(1000 * (cpu - other_cpu) / labels.checked, 2),
            "other_checks_cpu_ms_per_image": round(1000 * other_cpu / labels.checked, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--arrival", type=int, default=400)
    parser.add_argument("--moved", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoke-bench-labels-") as tmp:
        write_digits(os.path.join(tmp, "digits"))
        pool = digits(os.path.join(tmp, "digits"))
        root = served_root(tmp, pool, args.train, args.epochs)
        rest = pool[args.train:]
        runs = [measure(*arrival(tmp, root, rest, seed, args.arrival, args.moved), seed)
                for seed in (int(s) for s in args.seeds.split(","))]
        # Proportional: every digit not trained on as one span, twice the size or more, the same share moved.
        scale = measure(*arrival(tmp, root, rest, 0, len(rest), round(args.moved * len(rest) / args.arrival)), 0)
    print(json.dumps({"benchmark": "label_errors", "network": "small_cnn", "image_size": 32, "train_digits": args.train,
                      "runs": runs, "mean_precision": round(float(np.mean([r["precision"] or 0 for r in runs])), 3),
                      "mean_recall": round(float(np.mean([r["recall"] for r in runs])), 3),
                      "label_check_cpu_ms_per_image": float(np.median([r["label_check_cpu_ms_per_image"] for r in runs])),
                      "whole_rest_as_one_span": scale}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
