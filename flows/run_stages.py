"""`stoke run SOURCE --root ROOT [train flags] [gate flags]`: ingest -> train -> validate -> push.

Each stage is its own program, started exactly as a flow or a Kubernetes Job would start it, with
`--json`; this file only passes flags and reads each stage's last JSON line. A refused model is a
normal outcome (exit 0, `pushed_version` null, the reasons printed); a failing stage stops the run
with its own message and exit code.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types

from components.config import IngestConfig, PushConfig, TrainConfig, ValidateConfig, add_arguments

SHARED = {"root", "run_id", "model_name"}


def _stage(module: str, argv: list[str]) -> tuple[int, dict]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    process = subprocess.run([sys.executable, "-m", module, *argv, "--json"], stdout=subprocess.PIPE, text=True, env=env)
    lines = process.stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1]) if lines else {}
    except ValueError:
        summary = {}
    return process.returncode, summary


def _flags(args: argparse.Namespace, model, skip=SHARED) -> list[str]:
    """Re-creates the command-line flags of `model`'s fields that differ from their defaults."""
    out = []
    for name, field in model.model_fields.items():
        if name in skip or not hasattr(args, name):
            continue
        value = getattr(args, name)
        if value is None or (not field.is_required() and value == field.default):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoke run", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="raw images: folder of class subfolders, or a CSV/JSONL manifest")
    parser.add_argument("--root", required=True, help="artifact ROOT: local path or fsspec URI")
    parser.add_argument("--run-id", default=None, help="run folder under ROOT/runs (default: run-<time>)")
    parser.add_argument("--model-name", default="stoke", help="model in ROOT/models")
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    _add(parser.add_argument_group("ingest"), IngestConfig, skip=SHARED | {"source"})
    train = parser.add_argument_group("training")
    _add(train, TrainConfig, skip=SHARED | {"spans"})
    gate = parser.add_argument_group("validation and push")
    _add(gate, ValidateConfig)
    _add(gate, PushConfig)
    return parser


def _add(group, model, skip=SHARED) -> None:
    """add_arguments for the fields not already on the parser (stages share some settings)."""
    taken = {a.dest for a in group._group_actions} | {a.dest for a in group._actions}
    fields = {n: f for n, f in model.model_fields.items() if n not in skip and n not in taken}
    add_arguments(group, types.SimpleNamespace(model_fields=fields))


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run_id = args.run_id or time.strftime("run-%Y%m%d-%H%M%S")
    common = ["--root", args.root]
    summary = {"run_id": run_id, "model_name": args.model_name, "blessed": False, "pushed_version": None,
               "reasons": [], "metrics": {}, "stages": {}}

    def stop(stage: str, code: int, result: dict) -> int:
        message = result.get("error") or f"{stage} failed with exit code {code}"
        print(f"stoke run: error: {stage}: {message}", file=sys.stderr, flush=True)
        summary["error"] = f"{stage}: {message}"
        _emit(summary, args.json)
        return code or 1

    code, ingested = _stage("beam_jobs.ingest", [args.source, *common, *_flags(args, IngestConfig, skip=SHARED | {"source"})])
    summary["stages"]["ingest"] = ingested
    if code:
        return stop("ingest", code, ingested)
    train_flags = _flags(args, TrainConfig, skip=SHARED | {"spans"})
    code, trained = _stage("components.train", [*common, "--run-id", run_id, *train_flags])
    summary["stages"]["train"] = {k: trained.get(k) for k in ("run_dir", "spans", "total_steps", "eval", "error")}
    if code:
        return stop("train", code, trained)
    gate = ["--model-name", args.model_name]
    code, validated = _stage("components.validate", [*common, "--run-id", run_id, *gate,
                                                     *_flags(args, ValidateConfig)])
    if code:
        return stop("validate", code, validated)
    summary.update(blessed=validated["blessed"], reasons=validated["reasons"], notes=validated.get("notes", []),
                   metrics={k: validated["metrics"].get(k) for k in ("accuracy", "top_k_accuracy", "example_count",
                                                                     "majority_class_rate")},
                   baseline_version=validated.get("baseline_version"), validation_uri=validated["validation_uri"])
    if validated["blessed"]:
        code, pushed = _stage("components.export", [*common, "--run-id", run_id, *gate, *_flags(args, PushConfig)])
        if code:
            return stop("push", code, pushed)
        summary.update(pushed_version=pushed["version"], model_uri=pushed["model_uri"],
                       serving_uri=pushed["serving_uri"], commands=pushed["commands"])
    _emit(summary, args.json)
    return 0


def _emit(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True), flush=True)
        return
    if summary.get("pushed_version"):
        print(f"{summary['run_id']}: blessed and pushed as version {summary['pushed_version']} "
              f"(accuracy {summary['metrics'].get('accuracy')})", flush=True)
    elif "error" not in summary:
        print(f"{summary['run_id']}: not blessed, nothing pushed:" +
              "".join(f"\n  - {r}" for r in summary["reasons"]), flush=True)


if __name__ == "__main__":
    sys.exit(run())
