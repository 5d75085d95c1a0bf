"""`python -m components.gate --root ROOT --run-id ID`: the gate between training and serving.

TensorFlow Model Analysis evaluates the candidate on the eval split of the spans it trained on,
through its tf.Example signature: accuracy, top-k accuracy, accuracy per class (a slice per label)
and the confusion matrix. The newest version in ROOT/models/<name>/ is evaluated on the same
records as the baseline. Two thresholds decide, both given to TFMA so its validation result agrees:
a floor on accuracy (default: beat the share of the most common class, so a model that learned
nothing is never blessed) and at most --max-regression below the served version. When the candidate
knows classes the served version does not (labels are append-only, so they come last), the two are
compared on the classes both know: accuracy on those classes' records, from TFMA's per-class slices.
A fresh process then checks the serving contract with the warm-up requests the push will ship.

Writes ROOT/runs/ID/: tfma/, validation.json, confusion_matrix.png, warmup/, and BLESSED or
NOT_BLESSED last. Exit 0 either way: a refused model is a normal outcome.
"""
from __future__ import annotations

import collections
import json
import os
import posixpath
import subprocess
import sys
import tempfile

from components.common import clock, plots, processes
from components.common.files import exists, filesystem, is_local, join, remove, write_text
from components.common.repository import SAVED_MODEL, Repository, RepositoryError
from components.contracts import program, schema
from components.contracts.config import ValidateConfig, from_arguments
from components.contracts.layout import Root
from components.contracts.results import ResultError, TrainMetrics, Validation
from components.gate.tfma import eval_config_for, label_name, read_tfma, run_tfma

# Loading the model, replaying the warm-up and, when there is one, starting the real server.
SERVING_CHECK_SECONDS = 15 * 60


class ValidateError(Exception):
    """A refusal with a message for the user (no traceback)."""


def run(argv: list[str] | None = None) -> int:
    args = program.arguments("stoke validate", __doc__, ValidateConfig).parse_args(argv)
    return program.main("stoke validate", args.json, lambda: validate(from_arguments(ValidateConfig, args)),
                        _describe, errors=(ValidateError, RepositoryError, ResultError))


def _describe(summary: dict) -> str:
    verdict = "BLESSED" if summary["blessed"] else "NOT BLESSED"
    return (f"{verdict}: accuracy {summary['metrics']['accuracy']:.4f}"
            + "".join(f"\n  - {reason}" for reason in summary["reasons"] + summary["notes"]))


def validate(config: ValidateConfig) -> dict:

    root = Root(config.root)
    run = root.run(config.run_id)
    if not exists(run.metrics):
        raise ValidateError(f"run {config.run_id} has no {run.metrics}: training did not finish there "
                            "(check --run-id and --root)")
    trained = TrainMetrics.read(run.metrics)
    candidate = run.candidate
    if not exists(join(candidate, SAVED_MODEL)):
        raise ValidateError(f"run {config.run_id} has no candidate SavedModel at {candidate}")
    labels, spans = trained.labels, trained.spans
    shards = root.shards("eval", spans)
    if not sum(s.records for s in shards):
        raise ValidateError(f"spans {spans} of run {config.run_id} have no eval records to validate on")

    counts, warm_images = _scan_eval(shards, config.warmup_images)
    total = sum(counts.values())
    majority_id, majority_count = counts.most_common(1)[0]
    majority_rate = majority_count / total
    if config.min_accuracy is not None:
        floor, floor_inclusive = config.min_accuracy, True
        floor_source = "--min-accuracy"
    else:
        floor, floor_inclusive = majority_rate, False
        floor_source = (f"must beat {majority_rate:.4f}, the share of the most common class "
                        f"({label_name(labels, majority_id)}) in the eval split")

    repo = Repository(root, config.model_name)
    baseline_version = repo.newest()
    notes: list[str] = []
    baseline_uri = None
    shared: list[str] | None = None  # the classes compared on, when the candidate added some
    if baseline_version is not None:
        lineage = repo.lineage(baseline_version)
        served_labels = list(lineage.labels) if lineage else None
        if served_labels is None or served_labels == list(labels):
            baseline_uri = repo.version_uri(baseline_version)
        elif 0 < len(served_labels) < len(labels) and list(labels[:len(served_labels)]) == served_labels:
            shared, baseline_uri = served_labels, repo.version_uri(baseline_version)
            notes.append(f"the label set grew (served version {baseline_version} knows {len(shared)} classes, the "
                         f"candidate added {', '.join(labels[len(shared):])}): compared on the {len(shared)} "
                         "classes both know")
        else:
            notes.append(f"baseline comparison skipped: the label set changed (served version {baseline_version} "
                         f"has {len(served_labels)} labels, the candidate {len(labels)}); only the accuracy floor applies")
    else:
        notes.append("no served version yet: only the accuracy floor applies")

    top_k = min(config.top_k, len(labels))
    tfma_uri = run.tfma
    with tempfile.TemporaryDirectory(prefix="stoke-validate-") as scratch:
        eval_config = eval_config_for(floor + (0.0 if floor_inclusive else 1e-9), config.max_regression,
                                      top_k, with_baseline=baseline_uri is not None, overall_change=shared is None)
        models = {"candidate": _tf_readable(candidate, scratch, "candidate")}
        if baseline_uri:
            models["baseline"] = _tf_readable(baseline_uri, scratch, "baseline")
        run_tfma(eval_config, models, shards, tfma_uri)
        results = read_tfma(tfma_uri, labels, top_k)

        warmup_uri = run.warmup
        _write_warmup(warmup_uri, warm_images, config.model_name)
        serving = serving_check(models["candidate"], _tf_readable(warmup_uri, scratch, "warmup"), config.model_name)

    metrics = results["candidate"]
    metrics["majority_class_rate"] = majority_rate
    metrics["eval_label_counts"] = {label_name(labels, k): v for k, v in sorted(counts.items())}
    baseline = results.get("baseline")
    reasons = []
    accuracy = metrics["accuracy"]
    if accuracy < floor or (not floor_inclusive and accuracy <= floor):
        if config.min_accuracy is not None:
            reasons.append(f"accuracy {accuracy:.4f} is below the required {floor:.4f} (--min-accuracy)")
        else:
            reasons.append(f"accuracy {accuracy:.4f} does not beat {floor:.4f}, what always answering the most "
                           f"common class ({label_name(labels, majority_id)}) scores on the eval split")
    shared_classes = shared_comparison(metrics, baseline, shared) if baseline is not None and shared else None
    if shared_classes is not None:
        drop = shared_classes["baseline_accuracy"] - shared_classes["accuracy"]
        if drop > config.max_regression + 1e-9:
            reasons.append(f"on the {len(shared)} classes both models know, accuracy {shared_classes['accuracy']:.4f} "
                           f"is {drop:.4f} below the served version {baseline_version} "
                           f"({shared_classes['baseline_accuracy']:.4f}); allowed regression {config.max_regression}")
        notes.append("per class, candidate vs served: " + ", ".join(
            f"{name} {value:.4f} vs {shared_classes['baseline_per_class_accuracy'][name]:.4f}"
            for name, value in shared_classes["per_class_accuracy"].items()))
    elif baseline is not None:
        drop = baseline["accuracy"] - accuracy
        if drop > config.max_regression + 1e-9:
            reasons.append(f"accuracy {accuracy:.4f} is {drop:.4f} below the served version {baseline_version} "
                           f"({baseline['accuracy']:.4f}); allowed regression {config.max_regression}")
    reasons += [f"serving check: {problem}" for problem in serving["problems"]]
    if not results["validation_ok"] and not reasons:
        reasons.append("TFMA's validation failed: " + "; ".join(results["validation_failures"]))
    if serving.get("real_server", {}).get("status") == "skipped":
        notes.append(f"real TF Serving check skipped: {serving['real_server']['reason']}")

    plot_uri = run.confusion_matrix
    plots.confusion_matrix(metrics["confusion_matrix"], labels, plot_uri,
                   title=f"{config.run_id}: accuracy {accuracy:.3f}")
    blessed = not reasons
    validation = Validation.model_validate({
        "run_id": config.run_id,
        "model_name": config.model_name,
        "blessed": blessed,
        "reasons": reasons,
        "notes": notes,
        "metrics": metrics,
        "baseline": baseline,
        "baseline_version": baseline_version if baseline is not None else None,
        "shared_classes": shared_classes,
        "served_version": baseline_version,
        "thresholds": {"min_accuracy": floor, "min_accuracy_inclusive": floor_inclusive,
                       "min_accuracy_source": floor_source, "max_regression": config.max_regression,
                       "compared_to_baseline": baseline is not None, "top_k": top_k},
        "serving_check": serving,
        "labels": labels,
        "spans": spans,
        "tfma_uri": tfma_uri,
        "tfma_validation_ok": results["validation_ok"],
        "confusion_matrix_uri": plot_uri,
        "warmup_uri": warmup_uri,
        "validation_uri": run.validation,
        "validated_at": clock.now(),
    })
    validation.write(run.validation)
    for marker in (run.blessed, run.not_blessed):
        if exists(marker):
            remove(marker)
    # The marker last: its presence means validation.json beside it is complete.
    write_text(run.blessed if blessed else run.not_blessed, "\n".join(reasons or ["blessed"]) + "\n")
    return validation.to_json()


def shared_comparison(candidate: dict, baseline: dict, classes: list[str]) -> dict:
    """Both models' accuracy on the records of `classes` alone, weighted from TFMA's per-class slices
    (a candidate that answers a new class for one of them is wrong there, as it would be in serving)."""
    counts = {name: candidate["per_class_examples"].get(name, 0) for name in classes}
    seen = [name for name in classes if counts[name]]
    total = sum(counts.values())

    def restricted(model: dict) -> float:
        return sum(model["per_class_accuracy"].get(name, 0.0) * counts[name] for name in seen) / max(total, 1)

    return {"classes": classes, "example_count": total, "accuracy": restricted(candidate),
            "baseline_accuracy": restricted(baseline),
            "per_class_accuracy": {name: candidate["per_class_accuracy"].get(name, 0.0) for name in seen},
            "baseline_per_class_accuracy": {name: baseline["per_class_accuracy"].get(name, 0.0) for name in seen}}


def _scan_eval(shards, keep_images: int) -> tuple[collections.Counter, list[bytes]]:
    """Label counts of the eval split and the first images of distinct classes for warm-up."""
    import tensorflow as tf

    spec = {schema.LABEL: schema.feature_spec()[schema.LABEL], schema.ENCODED: schema.feature_spec()[schema.ENCODED]}
    counts: collections.Counter = collections.Counter()
    images: list[tuple[int, bytes]] = []
    for shard in shards:
        records = tf.data.TFRecordDataset(shard.uri, compression_type=shard.compression).batch(256)
        for batch in records.map(lambda b: tf.io.parse_example(b, spec)).as_numpy_iterator():
            counts.update(int(v) for v in batch[schema.LABEL])
            if len(images) < keep_images * 4:
                images.extend(zip((int(v) for v in batch[schema.LABEL]), batch[schema.ENCODED]))
    # Round-robin over classes so the warm-up batch looks like real traffic.
    by_class = collections.defaultdict(list)
    for label, encoded in images:
        by_class[label].append(bytes(encoded))
    chosen = []
    while len(chosen) < keep_images and any(by_class.values()):
        for label in sorted(by_class):
            if by_class[label] and len(chosen) < keep_images:
                chosen.append(by_class[label].pop(0))
    return counts, chosen


def _tf_readable(uri: str, scratch: str, name: str) -> str:
    """A path TensorFlow can open: local paths and gs:// as they are, other stores copied to scratch."""
    fs, path = filesystem(uri)
    if is_local(fs):
        return path
    if uri.startswith("gs://"):
        return uri
    local = os.path.join(scratch, name)
    fs.get(path, local, recursive=fs.isdir(path))
    return local


def _write_warmup(uri: str, images: list[bytes], model_name: str) -> None:
    from components.gate import warmup

    fs, path = filesystem(uri)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    records = warmup.prediction_logs(images, model_name, batch_sizes=(1, len(images)))
    fs.pipe_file(path, warmup.tfrecord_bytes(records))


def serving_check(model_dir: str, warmup_path: str, model_name: str) -> dict:
    """Runs components.gate.serving_check in a fresh process: nothing of this process's state helps it."""
    from components.common.serving import SERVING_IMAGE, SERVING_VERSION

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    env.pop("TF_USE_LEGACY_KERAS", None)
    try:
        result = processes.run(
            [sys.executable, "-m", "components.gate.serving_check", model_dir, "--warmup", warmup_path,
             "--model-name", model_name, "--serving-image", f"{SERVING_IMAGE}:{SERVING_VERSION}"],
            timeout=SERVING_CHECK_SECONDS, env=env)
        lines = result.stdout.strip().splitlines()
        why = None if result.returncode == 0 and lines else (result.stderr.strip().splitlines()[-1:] or ["no output"])[0]
    except subprocess.TimeoutExpired:
        why = f"it did not finish within {SERVING_CHECK_SECONDS} s"
    if why:
        return {"ok": False, "problems": [f"the SavedModel could not be served in a fresh process: {why}"],
                "real_server": {"status": "skipped", "reason": "the in-process check failed first"}}
    return json.loads(lines[-1])
