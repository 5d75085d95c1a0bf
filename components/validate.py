"""`python -m components.validate --root ROOT --run-id ID`: the gate between training and serving.

TensorFlow Model Analysis evaluates the candidate on the eval split of the spans it trained on,
through its tf.Example signature: accuracy, top-k accuracy, accuracy per class (a slice per label)
and the confusion matrix. The newest version in ROOT/models/<name>/ is evaluated on the same
records as the baseline. Two thresholds decide, both given to TFMA so its validation result agrees:
a floor on accuracy (default: beat the share of the most common class, so a model that learned
nothing is never blessed) and at most --max-regression below the served version. A fresh process
then checks the serving contract with the warm-up requests the push will ship.

Writes ROOT/runs/ID/: tfma/, validation.json, confusion_matrix.png, warmup/, and BLESSED or
NOT_BLESSED last. Exit 0 either way: a refused model is a normal outcome.
"""
from __future__ import annotations

import collections
import datetime
import json
import os
import posixpath
import subprocess
import sys
import tempfile


from components import plots, program
from components.config import ValidateConfig, from_arguments
from components.layout import Root, exists, filesystem, is_local, join, read_json, write_json
from components.model_repository import Repository, RepositoryError

LABEL_KEY = "image/class/label"
EXAMPLES_SIGNATURE = "examples"
BLESSED = "BLESSED"
NOT_BLESSED = "NOT_BLESSED"


class ValidateError(Exception):
    """A refusal with a message for the user (no traceback)."""


def run(argv: list[str] | None = None) -> int:
    args = program.arguments("stoke validate", __doc__, ValidateConfig).parse_args(argv)
    return program.main("stoke validate", args.json, lambda: validate(from_arguments(ValidateConfig, args)),
                        _describe, errors=(ValidateError, RepositoryError))


def _describe(summary: dict) -> str:
    verdict = "BLESSED" if summary["blessed"] else "NOT BLESSED"
    return (f"{verdict}: accuracy {summary['metrics']['accuracy']:.4f}"
            + "".join(f"\n  - {reason}" for reason in summary["reasons"] + summary["notes"]))



def validate(config: ValidateConfig) -> dict:
    from components import input_pipeline

    root = Root(config.root)
    run_dir = root.run(config.run_id)
    if not exists(join(run_dir, "metrics.json")):
        raise ValidateError(f"run {config.run_id} has no metrics.json under {run_dir}: "
                            "training did not finish there (check --run-id and --root)")
    trained = read_json(join(run_dir, "metrics.json"))
    candidate = join(run_dir, "candidate")
    if not exists(join(candidate, "saved_model.pb")):
        raise ValidateError(f"run {config.run_id} has no candidate SavedModel at {candidate}")
    labels, spans = trained["labels"], trained["spans"]
    shards = input_pipeline.list_shards(root, "eval", spans)
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
                        f"({_label(labels, majority_id)}) in the eval split")

    repo = Repository(root, config.model_name)
    baseline_version = repo.newest()
    notes: list[str] = []
    baseline_uri = None
    if baseline_version is not None:
        lineage = repo.lineage(baseline_version) or {}
        served_labels = lineage.get("labels")
        if served_labels is not None and list(served_labels) != list(labels):
            notes.append(f"baseline comparison skipped: the label set changed (served version {baseline_version} "
                         f"has {len(served_labels)} labels, the candidate {len(labels)}); only the accuracy floor applies")
        else:
            baseline_uri = repo.version_uri(baseline_version)
    else:
        notes.append("no served version yet: only the accuracy floor applies")

    top_k = min(config.top_k, len(labels))
    tfma_uri = join(run_dir, "tfma")
    with tempfile.TemporaryDirectory(prefix="stoke-validate-") as scratch:
        eval_config = eval_config_for(floor + (0.0 if floor_inclusive else 1e-9), config.max_regression,
                                      top_k, with_baseline=baseline_uri is not None)
        models = {"candidate": _tf_readable(candidate, scratch, "candidate")}
        if baseline_uri:
            models["baseline"] = _tf_readable(baseline_uri, scratch, "baseline")
        run_tfma(eval_config, models, shards, tfma_uri)
        results = read_tfma(tfma_uri, labels, top_k)

        warmup_uri = join(run_dir, "warmup", "tf_serving_warmup_requests")
        _write_warmup(warmup_uri, warm_images, config.model_name)
        serving = serving_check(models["candidate"], _tf_readable(warmup_uri, scratch, "warmup"), config.model_name)

    metrics = results["candidate"]
    metrics["majority_class_rate"] = majority_rate
    metrics["eval_label_counts"] = {_label(labels, k): v for k, v in sorted(counts.items())}
    baseline = results.get("baseline")
    reasons = []
    accuracy = metrics["accuracy"]
    if accuracy < floor or (not floor_inclusive and accuracy <= floor):
        if config.min_accuracy is not None:
            reasons.append(f"accuracy {accuracy:.4f} is below the required {floor:.4f} (--min-accuracy)")
        else:
            reasons.append(f"accuracy {accuracy:.4f} does not beat {floor:.4f}, what always answering the most "
                           f"common class ({_label(labels, majority_id)}) scores on the eval split")
    if baseline is not None:
        drop = baseline["accuracy"] - accuracy
        if drop > config.max_regression + 1e-9:
            reasons.append(f"accuracy {accuracy:.4f} is {drop:.4f} below the served version {baseline_version} "
                           f"({baseline['accuracy']:.4f}); allowed regression {config.max_regression}")
    reasons += [f"serving check: {problem}" for problem in serving["problems"]]
    if not results["validation_ok"] and not reasons:
        reasons.append("TFMA's validation failed: " + "; ".join(results["validation_failures"]))
    if serving.get("real_server", {}).get("status") == "skipped":
        notes.append(f"real TF Serving check skipped: {serving['real_server']['reason']}")

    plot_uri = join(run_dir, "confusion_matrix.png")
    plots.confusion_matrix(metrics["confusion_matrix"], labels, plot_uri,
                   title=f"{config.run_id}: accuracy {accuracy:.3f}")
    blessed = not reasons
    summary = {
        "run_id": config.run_id,
        "model_name": config.model_name,
        "blessed": blessed,
        "reasons": reasons,
        "notes": notes,
        "metrics": metrics,
        "baseline": baseline,
        "baseline_version": baseline_version if baseline is not None else None,
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
        "validation_uri": join(run_dir, "validation.json"),
        "validated_at": _now(),
    }
    write_json(summary["validation_uri"], summary)
    fs, run_path = filesystem(run_dir)
    for marker in (BLESSED, NOT_BLESSED):
        if fs.exists(posixpath.join(run_path, marker)):
            fs.rm(posixpath.join(run_path, marker))
    # The marker last: its presence means validation.json beside it is complete.
    fs.pipe_file(posixpath.join(run_path, BLESSED if blessed else NOT_BLESSED),
                 ("\n".join(reasons or ["blessed"]) + "\n").encode())
    return summary


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _label(labels: list[str], class_id: int) -> str:
    return labels[class_id] if 0 <= class_id < len(labels) else str(class_id)


def _scan_eval(shards, keep_images: int) -> tuple[collections.Counter, list[bytes]]:
    """Label counts of the eval split and the first images of distinct classes for warm-up."""
    import tensorflow as tf

    from components import schema

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


def eval_config_for(min_accuracy: float, max_regression: float, top_k: int, with_baseline: bool):
    """TFMA EvalConfig: thresholds on the overall slice only; per-label slices for per-class accuracy."""
    from tensorflow_model_analysis.proto import config_pb2

    def spec(name: str, baseline: bool) -> config_pb2.ModelSpec:
        return config_pb2.ModelSpec(name=name, signature_name=EXAMPLES_SIGNATURE, label_key=LABEL_KEY,
                                    prediction_key="probabilities", is_baseline=baseline)

    threshold = config_pb2.MetricThreshold(
        value_threshold=config_pb2.GenericValueThreshold(lower_bound={"value": min_accuracy}))
    if with_baseline:
        threshold.change_threshold.CopyFrom(config_pb2.GenericChangeThreshold(
            direction=config_pb2.MetricDirection.HIGHER_IS_BETTER, absolute={"value": -max_regression - 1e-9}))
    accuracy = config_pb2.MetricConfig(class_name="SparseCategoricalAccuracy", config='{"name": "accuracy"}')
    accuracy.per_slice_thresholds.add(slicing_specs=[config_pb2.SlicingSpec()], threshold=threshold)
    metrics = config_pb2.MetricsSpec(metrics=[
        config_pb2.MetricConfig(class_name="ExampleCount"),
        accuracy,
        config_pb2.MetricConfig(class_name="SparseTopKCategoricalAccuracy",
                                config=json.dumps({"name": "top_k_accuracy", "k": top_k})),
        config_pb2.MetricConfig(class_name="MultiClassConfusionMatrixPlot"),
    ])
    models = [spec("candidate", False)] + ([spec("baseline", True)] if with_baseline else [])
    return config_pb2.EvalConfig(model_specs=models, metrics_specs=[metrics],
                                 slicing_specs=[config_pb2.SlicingSpec(), config_pb2.SlicingSpec(feature_keys=[LABEL_KEY])])


def run_tfma(eval_config, models: dict[str, str], shards, output_uri: str) -> None:
    """One Beam pipeline (DirectRunner): read every eval shard, evaluate all models, write results."""
    import apache_beam as beam
    import tensorflow_model_analysis as tfma
    from apache_beam.io.filesystem import CompressionTypes
    from tfx_bsl.tfxio import tf_example_record

    codecs = {"GZIP": CompressionTypes.GZIP, "ZLIB": CompressionTypes.DEFLATE, "": CompressionTypes.UNCOMPRESSED}
    shared = [tfma.default_eval_shared_model(path, eval_config=eval_config, model_name=name)
              for name, path in models.items()]
    to_arrow = tf_example_record.TFExampleBeamRecord(
        physical_format="tfrecord", raw_record_column_name=tfma.ARROW_INPUT_COLUMN,
        telemetry_descriptors=["stoke"])
    with beam.Pipeline(runner="DirectRunner") as pipeline:
        reads = [pipeline | f"Read{i}" >> beam.io.ReadFromTFRecord(
                    shard.uri, compression_type=codecs[shard.compression], validate=False)
                 for i, shard in enumerate(shards)]
        _ = (reads | "Flatten" >> beam.Flatten()
             | "ToArrow" >> to_arrow.BeamSource()
             | "Evaluate" >> tfma.ExtractEvaluateAndWriteResults(
                 eval_config=eval_config, eval_shared_model=shared if len(shared) > 1 else shared[0],
                 output_path=output_uri))


def read_tfma(output_uri: str, labels: list[str], top_k: int) -> dict:
    """Metrics per model from TFMA's output: overall, per class, confusion matrix, validation result."""
    import tensorflow_model_analysis as tfma

    results: dict = collections.defaultdict(lambda: {"per_class_accuracy": {}, "per_class_examples": {}})
    for record in tfma.load_metrics(output_uri):
        keys = list(record.slice_key.single_slice_keys)
        for item in record.metric_keys_and_values:
            if item.key.is_diff:
                continue
            value = item.value.double_value.value
            model = results[item.key.model_name or "candidate"]
            if not keys:
                name = {"accuracy": "accuracy", "top_k_accuracy": "top_k_accuracy", "example_count": "example_count"}.get(
                    item.key.name)
                if name:
                    model[name] = int(value) if name == "example_count" else value
            elif keys[0].column == LABEL_KEY:
                label = _label(labels, int(keys[0].int64_value))
                if item.key.name == "accuracy":
                    model["per_class_accuracy"][label] = value
                elif item.key.name == "example_count":
                    model["per_class_examples"][label] = int(value)
    for record in tfma.load_plots(output_uri):
        if record.slice_key.single_slice_keys:
            continue
        for item in record.plot_keys_and_values:
            matrices = item.value.multi_class_confusion_matrix_at_thresholds.matrices
            if not matrices:
                continue
            size = len(labels)
            matrix = [[0] * size for _ in range(size)]
            for entry in matrices[0].entries:
                if 0 <= entry.actual_class_id < size and 0 <= entry.predicted_class_id < size:
                    matrix[entry.actual_class_id][entry.predicted_class_id] += int(round(entry.num_weighted_examples))
            results[item.key.model_name or "candidate"]["confusion_matrix"] = matrix
    for model in results.values():
        model["top_k"] = top_k
    validation = tfma.load_validation_result(output_uri)
    failures = [f"{failure.metric_key.name} ({failure.metric_key.model_name}): {failure.message}"
                for per_slice in validation.metric_validations_per_slice for failure in per_slice.failures]
    out = dict(results)
    out["validation_ok"] = bool(validation.validation_ok)
    out["validation_failures"] = failures
    return out


def _write_warmup(uri: str, images: list[bytes], model_name: str) -> None:
    from components import warmup

    fs, path = filesystem(uri)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    records = warmup.prediction_logs(images, model_name, batch_sizes=(1, len(images)))
    fs.pipe_file(path, warmup.tfrecord_bytes(records))


def serving_check(model_dir: str, warmup_path: str, model_name: str) -> dict:
    """Runs components.serving_check in a fresh process: nothing of this process's state helps it."""
    from components.serving import SERVING_IMAGE, SERVING_VERSION

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    env.pop("TF_USE_LEGACY_KERAS", None)
    result = subprocess.run(
        [sys.executable, "-m", "components.serving_check", model_dir, "--warmup", warmup_path,
         "--model-name", model_name, "--serving-image", f"{SERVING_IMAGE}:{SERVING_VERSION}"],
        capture_output=True, text=True, env=env)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "problems": [f"the SavedModel could not be served in a fresh process: {tail[0]}"],
                "real_server": {"status": "skipped", "reason": "the in-process check failed first"}}
    return json.loads(lines[-1])


if __name__ == "__main__":
    sys.exit(run())
