"""TF Serving warm-up requests: `assets.extra/tf_serving_warmup_requests`, a TFRecord file of
PredictionLog records that the server replays after loading a version and before serving it, so
the first real request does not pay for graph initialization and kernel selection.

The same records are what validation runs through the candidate in a fresh process, so what the
server will replay has been tried before the push.
"""
from __future__ import annotations

import tempfile

from components.common.tf_files import local_copy
from components.common.tfrecord import frame
from components.contracts.schema import SERVING_INPUT, SERVING_SIGNATURE

# TF Serving reads at most this many warm-up records.
MAX_RECORDS = 1000


def prediction_logs(images: list[bytes], model_name: str, batch_sizes: tuple[int, ...] = (1, 8)) -> list[bytes]:
    """Serialized PredictionLog records: one PredictRequest per batch size, filled with `images`."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    if not images:
        raise ValueError("warm-up requests need at least one image")
    records = []
    for size in sorted({min(max(s, 1), len(images)) for s in batch_sizes}):
        batch = [images[i % len(images)] for i in range(size)]
        request = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=model_name, signature_name=SERVING_SIGNATURE))
        request.inputs[SERVING_INPUT].CopyFrom(tf.make_tensor_proto(batch, dtype=tf.string, shape=[size]))
        log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
        records.append(log.SerializeToString())
    return records[:MAX_RECORDS]


def tfrecord_bytes(records: list[bytes]) -> bytes:
    """The records framed as an uncompressed TFRecord file (what TF Serving's warm-up reader expects)."""
    return b"".join(frame(record) for record in records)


def read_prediction_logs(uri: str) -> list:
    """PredictionLog messages from a warm-up file (local path or fsspec URI)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    with tempfile.TemporaryDirectory() as tmp:
        logs = []
        for record in tf.data.TFRecordDataset(local_copy(uri, tmp, "records")).as_numpy_iterator():
            log = prediction_log_pb2.PredictionLog()
            log.ParseFromString(record)
            logs.append(log)
    return logs


def request_images(log) -> list[bytes]:
    """The encoded images of one PredictionLog's PredictRequest."""
    import tensorflow as tf

    return [bytes(b) for b in tf.make_ndarray(log.predict_log.request.inputs[SERVING_INPUT]).reshape(-1)]
