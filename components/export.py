"""`python -m components.export --root ROOT --run-id ID`: the push of a blessed candidate.

Refuses a run without BLESSED, a run validated against a served version that is no longer the
newest (validate again), and pushes a run at most once (a second push reports the first). The
version folder gets the candidate, `assets.extra/tf_serving_warmup_requests` (the requests
validation replayed) and `assets.extra/stoke_lineage.json`; it appears atomically
(components/model_repository.py). Then retention keeps the newest --keep versions and ROOT/serving
is rendered again; the image is built when a container engine answers.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
import sys


from components import program
from components.config import PushConfig, from_arguments
from components.layout import Root, exists, filesystem, join, read_json, write_json
from components.model_repository import (ASSETS_EXTRA, LINEAGE_FILE, WARMUP_FILE, Repository,
                                         RepositoryError)
from components.serving import ServingError

PUSHED = "pushed.json"


class PushError(Exception):
    """A refusal with a message for the user (no traceback)."""


def run(argv: list[str] | None = None) -> int:
    args = program.arguments("stoke push", __doc__, PushConfig).parse_args(argv)
    return program.main("stoke push", args.json, lambda: push(from_arguments(PushConfig, args)), _describe,
                        errors=(PushError, RepositoryError, ServingError), failed={"pushed": False})


def _describe(summary: dict) -> str:
    if not summary["pushed"]:
        return summary["message"]
    return (f"pushed {summary['run_id']} as version {summary['version']} of {summary['model_name']}: "
            f"{summary['model_uri']}\n  build: {summary['commands']['docker_build']}\n"
            f"  run:   {summary['commands']['docker_run']}")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")



def push(config: PushConfig) -> dict:
    from components import serving

    root = Root(config.root)
    run_dir = root.run(config.run_id)
    repo = Repository(root, config.model_name)
    if not exists(join(run_dir, "BLESSED")):
        why = "it was not validated (run `stoke validate` first)"
        if exists(join(run_dir, "NOT_BLESSED")):
            reasons = read_json(join(run_dir, "validation.json")).get("reasons", [])
            why = "validation refused it: " + "; ".join(reasons)
        raise PushError(f"run {config.run_id} is not blessed: {why}")
    validation = read_json(join(run_dir, "validation.json"))
    if validation.get("model_name") != config.model_name:
        raise PushError(f"run {config.run_id} was validated for model {validation.get('model_name')!r}, "
                        f"not {config.model_name!r}; validate it against {config.model_name!r} first")

    pushed_uri = join(run_dir, PUSHED)
    if exists(pushed_uri):
        earlier = read_json(pushed_uri)
        cmds = serving.commands(root.serving, config.model_name, earlier["version"])
        return {"pushed": False, "already_pushed": True, "run_id": config.run_id, "model_name": config.model_name,
                "version": earlier["version"], "model_uri": earlier["model_uri"], "serving_uri": root.serving,
                "commands": cmds, "message": f"run {config.run_id} was already pushed as version "
                                             f"{earlier['version']} on {earlier['pushed_at']}; nothing to do"}

    cleaned = repo.remove_partial()
    newest = repo.newest()
    if newest != validation.get("served_version"):
        raise PushError(f"run {config.run_id} was validated while version {validation.get('served_version')} "
                        f"was the newest served; now it is {newest}. Run `stoke validate` again")

    candidate = join(run_dir, "candidate")
    trained_tf = serving.saved_model_tf_version(candidate)
    serving.check_server_version(trained_tf)
    version = repo.next_version()
    lineage = build_lineage(root, config, validation, version, trained_tf)
    warmup_fs, warmup_path = filesystem(join(run_dir, "warmup", WARMUP_FILE))
    warmup_bytes = warmup_fs.cat_file(warmup_path)
    model_uri = repo.publish(candidate, version, {
        f"{ASSETS_EXTRA}/{WARMUP_FILE}": warmup_bytes,
        f"{ASSETS_EXTRA}/{LINEAGE_FILE}": json.dumps(lineage, indent=2, sort_keys=True).encode(),
    })
    write_json(pushed_uri, {"version": version, "model_uri": model_uri, "pushed_at": lineage["pushed_at"]})
    retired = repo.apply_retention(config.keep, _now())
    rendered = serving.render(root, config.model_name)
    image = (serving.build_image(rendered["serving_uri"], rendered["commands"]["docker_build"])
             if config.build_image else {"built": False, "reason": "--no-build-image"})
    return {
        "pushed": True,
        "run_id": config.run_id,
        "model_name": config.model_name,
        "version": version,
        "model_uri": model_uri,
        "previous_version": newest,
        "versions": rendered["versions"],
        "retired": retired,
        "cleaned_partial": cleaned,
        "serving_uri": rendered["serving_uri"],
        "serving_image": rendered["serving_image"],
        "trained_tensorflow": trained_tf,
        "labels": rendered["labels"],
        "commands": rendered["commands"],
        "image": image,
        "metrics": {k: validation["metrics"][k] for k in ("accuracy", "top_k_accuracy", "example_count")},
    }


def build_lineage(root: Root, config: PushConfig, validation: dict, version: int, trained_tf: str) -> dict:
    """Served version -> run -> spans (with their manifests' hashes and counts) -> metrics, blessing."""
    from components import serving

    trained = read_json(join(root.run(config.run_id), "metrics.json"))
    spans = []
    for manifest_uri in (join(root.span(n), "_MANIFEST.json") for n in trained["spans"]):
        fs, path = filesystem(manifest_uri)
        raw = fs.cat_file(path)
        manifest = json.loads(raw)
        spans.append({"span": manifest["span"], "manifest_uri": manifest_uri,
                      "manifest_sha256": hashlib.sha256(raw).hexdigest(), "source": manifest.get("source"),
                      "created": manifest.get("created"), "counts": manifest.get("counts"),
                      "sources": len(manifest.get("sources", []))})
    return {
        "model_name": config.model_name,
        "version": version,
        "pushed_at": _now(),
        "run_id": config.run_id,
        "run_uri": root.run(config.run_id),
        "labels": trained["labels"],
        "spans": spans,
        "training": {k: trained.get(k) for k in ("model", "image_size", "precision", "strategy", "epochs",
                                                  "total_steps", "global_batch_size", "train", "eval")},
        "metrics": validation["metrics"],
        "blessing": {"blessed": validation["blessed"], "reasons": validation["reasons"],
                     "notes": validation.get("notes", []), "thresholds": validation["thresholds"],
                     "baseline_version": validation.get("baseline_version"),
                     "validation_uri": validation["validation_uri"], "validated_at": validation.get("validated_at")},
        "tensorflow_version": trained_tf,
        "serving_image": f"{serving.SERVING_IMAGE}:{serving.SERVING_VERSION}",
        "code_version": code_version(),
    }


def code_version() -> dict:
    """The stoke package version and, when the code runs from a git checkout, its commit."""
    from importlib import metadata
    from pathlib import Path

    info = {"package": None, "git_commit": None, "git_dirty": None}
    try:
        info["package"] = metadata.version("stoke")
    except metadata.PackageNotFoundError:
        pass
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            status = subprocess.run(["git", "status", "--porcelain", "--", "components", "beam_jobs"],
                                    cwd=here.parent, capture_output=True, text=True, timeout=10)
            info["git_dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


if __name__ == "__main__":
    sys.exit(run())
