"""The candidate SavedModel: float32, no XLA, the serving signature of DESIGN.md plus one for TFMA.

`serving_default`: `image_bytes` (string [N], encoded JPEG/PNG) -> `probabilities` (float32 [N, C]),
`class_ids` (int64 [N]), `labels` (string [N]).
`examples`: `examples` (string [N], serialized tf.Examples of the span schema) -> the same outputs,
so TensorFlow Model Analysis can feed eval records as they are stored.

The network is rebuilt under the float32 policy and given the trained weights (mixed-precision
models keep float32 variables), so TF Serving on any CPU or GPU runs it without float16 kernels,
and the functions are traced without jit_compile.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from components.contracts import schema
from components.train import input_pipeline
from components.train.models import build_model


class ServingModule(tf.Module):
    def __init__(self, model: keras.Model, labels: list[str], image_size: int):
        super().__init__()
        self.model = model
        self.image_size = image_size
        self.label_table = tf.constant(labels, dtype=tf.string)

    def _predict(self, image_bytes):
        size = self.image_size
        max_pixels = int(schema.MAX_MEGAPIXELS * 1e6)
        images = tf.map_fn(lambda b: input_pipeline.decode_eval(b, size, max_pixels), image_bytes,
                           fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8))
        probabilities = tf.nn.softmax(tf.cast(self.model(images, training=False), tf.float32), axis=-1)
        class_ids = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        return {"probabilities": probabilities, "class_ids": class_ids,
                "labels": tf.gather(self.label_table, class_ids)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=schema.SERVING_INPUT)])
    def serve_images(self, image_bytes):
        return self._predict(image_bytes)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=schema.EXAMPLES_INPUT)])
    def serve_examples(self, examples):
        parsed = tf.io.parse_example(examples, {schema.ENCODED: schema.feature_spec()[schema.ENCODED]})
        return self._predict(parsed[schema.ENCODED])


def export_candidate(*, network: str, weights: list, labels: list[str], image_size: int, path: str) -> str:
    """Writes the SavedModel to `path` (a local path or a URI TensorFlow writes, e.g. gs://)."""
    if tf.distribute.has_strategy():
        raise RuntimeError("export the candidate outside strategy.scope(): it is a single-device model")
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        model = build_model(network, len(labels), image_size)
        model.set_weights(weights)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    module = ServingModule(model, labels, image_size)
    tf.saved_model.save(module, path, signatures={
        schema.SERVING_SIGNATURE: module.serve_images.get_concrete_function(),
        schema.EXAMPLES_SIGNATURE: module.serve_examples.get_concrete_function(),
    })
    return path
