"""TensorFlow Model Analysis for the gate: the EvalConfig with its thresholds, one Beam pipeline that
evaluates the candidate (and the served baseline) on the eval shards, and the results read back.

The models are fed stored records through their `examples` signature, so TFMA sees exactly what
ingest published.
"""
from __future__ import annotations

import collections
import json

from components.common.beam_runner import runner_for
from components.common.program import unwritable
from components.common.quiet_beam import quiet_unless_debugging
from components.contracts import schema


def eval_config_for(min_accuracy: float, max_regression: float, top_k: int, with_baseline: bool,
                    overall_change: bool = True):
    """TFMA EvalConfig: thresholds on the overall slice only; per-label slices for per-class accuracy.
    Without `overall_change` the baseline is evaluated but not held to the overall change threshold
    (it cannot predict classes it was never taught)."""
    from tensorflow_model_analysis.proto import config_pb2

    def spec(name: str, baseline: bool) -> config_pb2.ModelSpec:
        return config_pb2.ModelSpec(name=name, signature_name=schema.EXAMPLES_SIGNATURE, label_key=schema.LABEL,
                                    prediction_key="probabilities", is_baseline=baseline)

    threshold = config_pb2.MetricThreshold(
        value_threshold=config_pb2.GenericValueThreshold(lower_bound={"value": min_accuracy}))
    if with_baseline and overall_change:
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
                                 slicing_specs=[config_pb2.SlicingSpec(), config_pb2.SlicingSpec(feature_keys=[schema.LABEL])])


def run_tfma(eval_config, models: dict[str, str], shards, output_uri: str) -> None:
    """One local Beam pipeline (components/common/beam_runner.py): read every eval shard, evaluate all models,
    write results."""
    import apache_beam as beam
    import tensorflow_model_analysis as tfma
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.options.pipeline_options import PipelineOptions
    from tfx_bsl.tfxio import tf_example_record

    codecs = {"GZIP": CompressionTypes.GZIP, "ZLIB": CompressionTypes.DEFLATE, "": CompressionTypes.UNCOMPRESSED}
    shared = [tfma.default_eval_shared_model(path, eval_config=eval_config, model_name=name)
              for name, path in models.items()]
    to_arrow = tf_example_record.TFExampleBeamRecord(
        physical_format="tfrecord", raw_record_column_name=tfma.ARROW_INPUT_COLUMN,
        telemetry_descriptors=["stoke"])
    options = PipelineOptions([])  # Beam's defaults: not read from the gate's own command line
    # A model that fails to load fails in every worker: each logs its traceback, the gate says it in one line.
    try:
        with quiet_unless_debugging(), beam.Pipeline(runner=runner_for(options), options=options) as pipeline:
            reads = [pipeline | f"Read{i}" >> beam.io.ReadFromTFRecord(
                        shard.uri, compression_type=codecs[shard.compression], validate=False)
                     for i, shard in enumerate(shards)]
            _ = (reads | "Flatten" >> beam.Flatten()
                 | "ToArrow" >> to_arrow.BeamSource()
                 | "Evaluate" >> tfma.ExtractEvaluateAndWriteResults(
                     eval_config=eval_config, eval_shared_model=shared if len(shared) > 1 else shared[0],
                     output_path=output_uri))
    except Exception as error:
        full = unwritable(error)
        if full is None or full.filename is not None:
            raise
        raise OSError(full.errno, full.strerror, output_uri) from error  # Beam's file sink names no file: its folder


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
            elif keys[0].column == schema.LABEL:
                label = label_name(labels, int(keys[0].int64_value))
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


def label_name(labels: list[str], class_id: int) -> str:
    return labels[class_id] if 0 <= class_id < len(labels) else str(class_id)
