"""The network a run trains, the weights it starts from, and the candidate SavedModel.

Every network enters through one contract (components/common/networks.py): a function of the number of
classes, the image size and the weights that returns a Keras model from uint8 [N, S, S, 3] to logits. This
module builds it for the run, compiles it with the recipe's optimizer, settles the weights it starts from and
exports what it learnt under the serving signature.
"""
from __future__ import annotations

import os

import tensorflow as tf
import tf_keras as keras

from components.common import networks, pretrained
from components.common.builtin_networks import FETCH_TIMEOUT_SECONDS, fetch_timeout
from components.common.files import is_uri
from components.contracts import schema
from components.contracts.config import network_parts
from components.train import TrainError
from components.train.data import decode_eval


def build_model(network: str, num_classes: int, image_size: int, weights: str | None = None) -> keras.Model:
    """The network `network` names under the current global mixed-precision policy, from `weights` (None, a
    local .h5 file, or "imagenet" for a network that fetches its own: initial_weights), held to the contract;
    a NetworkError (a ValueError) of one line when it cannot be."""
    return networks.build(networks.load(network), num_classes, image_size, weights)


def compile_model(model: keras.Model, optimizer, loss, jit_compile: bool, steps_per_execution: int):
    """The recipe's optimizer and loss (recipe.py); tf_keras wraps the optimizer in a LossScaleOptimizer
    by itself when the policy is mixed_float16. Accuracy is a weighted metric: tf_keras hands plain
    `metrics` no sample weights, and evaluation's blanks weigh 0."""
    model.compile(
        optimizer=optimizer,
        loss=loss,
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


# ---------------------------------------------------------------- the weights a run starts from
# None, a local Keras .h5 file, or keras.applications' ImageNet weights. Settled with the plan, once the
# spans are found and before any shard is staged or dataset built: a run that cannot have its weights
# stops in seconds with one line naming the ways out, instead of after staging shards or, worse,
# training from scratch a network that needs millions of images. A built-in network's ImageNet weights come
# from the Keras cache when a copy there matches keras.applications' hash (components/common/pretrained.py,
# which preflight reads too), else from keras.applications' own address, with a socket timeout: a machine
# behind a firewall that drops packets waits seconds, not the minutes of the system's default. A network
# of keras.applications by name, or of the user's code, is handed "imagenet" and fetches its own as it is
# built, into the same cache.

def initial_weights(weights: str | None, network: str, timeout: float = FETCH_TIMEOUT_SECONDS) -> str | None:
    """None (from scratch), the local .h5 file a built-in network starts from, or "imagenet" for a network that
    fetches its own ImageNet weights as it is built (keras.applications by name, the user's code); a TrainError
    saying why not. The shape of train.weights (none, imagenet or the path of an .h5 file) is checked by its
    setting."""
    if weights is None:
        raise TrainError("train.weights is unset: none, imagenet or the path of a Keras .h5 file (a preset fills it)")
    if weights == "none":
        return None
    if weights == "imagenet":
        kind, name, _ = network_parts(network)
        if kind != "builtin":
            return weights
        if name not in pretrained.IMAGENET:
            raise TrainError(f"train.network {network} has no ImageNet weights; set train.weights to none or a "
                             "weights file")
        return imagenet_file(name, timeout)
    if is_uri(weights) or not os.path.isfile(weights):
        raise TrainError(f"train.weights {weights}: no such local file (use none, imagenet or the path of a Keras "
                         ".h5 weights file)")
    return weights


def imagenet_file(network: str, timeout: float = FETCH_TIMEOUT_SECONDS, origin: str | None = None) -> str:
    """The cached copy of `network`'s ImageNet weights that matches their hash, else a fresh download."""
    cached = pretrained.cached_file(network)
    if cached:
        return cached
    name, base, md5 = pretrained.IMAGENET[network]
    origin = origin or base + name
    try:
        with fetch_timeout(timeout):
            return keras.utils.get_file(name, origin, cache_dir=pretrained.keras_homes()[0], cache_subdir="models",
                                        file_hash=md5)
    except Exception as exc:  # urllib's and get_file's errors, all of them: one line for the user either way
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainError(f"train.weights imagenet: {network}'s ImageNet weights are not in the Keras cache "
                         f"({pretrained.cache_path(network)}) and could not be fetched from {origin} "
                         f"({reason}); " + pretrained.WAYS_OUT.format(file=name)) from None


# ---------------------------------------------------------------- the candidate SavedModel
# float32, no XLA, the serving signature of docs/layout.md (Records) plus one for TFMA.
#
# `serving_default`: `image_bytes` (string [N], encoded JPEG/PNG) -> `probabilities` (float32 [N, C]),
# `class_ids` (int64 [N]), `labels` (string [N]).
# `examples`: `examples` (string [N], serialized tf.Examples of the span schema) -> the same outputs,
# so TensorFlow Model Analysis can feed eval records as they are stored.
#
# The network is rebuilt under the float32 policy and given the trained weights (mixed-precision
# models keep float32 variables), so TF Serving on any CPU or GPU runs it without float16 kernels,
# and the functions are traced without jit_compile. The module tracks the network as `model`, which
# is how a later run restores a served version's weights.

class ServingModule(tf.Module):
    def __init__(self, model: keras.Model, labels: list[str], image_size: int, untrained: list[str] = ()):
        super().__init__()
        self.model = model
        self.image_size = image_size
        self.label_table = tf.constant(labels, dtype=tf.string)
        # Classes no training record carried keep their ids (records store ids) and are never answered.
        self.untrained = tf.constant([name in untrained for name in labels]) if untrained else None

    def _predict(self, image_bytes):
        size = self.image_size
        max_pixels = int(schema.MAX_MEGAPIXELS * 1e6)
        images = tf.map_fn(lambda b: decode_eval(b, size, max_pixels), image_bytes,
                           fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8))
        logits = tf.cast(self.model(images, training=False), tf.float32)
        if self.untrained is not None:
            logits = tf.where(self.untrained, float("-inf"), logits)
        probabilities = tf.nn.softmax(logits, axis=-1)
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


def export_candidate(*, network: str, weights: list, labels: list[str], image_size: int, path: str,
                     untrained: list[str] = ()) -> str:
    """Writes the SavedModel to `path` (a local path or a URI TensorFlow writes, e.g. gs://); the classes of
    `untrained` get probability 0."""
    if tf.distribute.has_strategy():
        raise RuntimeError("export the candidate outside strategy.scope(): it is a single-device model")
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        model = build_model(network, len(labels), image_size)
        model.set_weights(weights)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    module = ServingModule(model, labels, image_size, untrained)
    tf.saved_model.save(module, path, signatures={
        schema.SERVING_SIGNATURE: module.serve_images.get_concrete_function(),
        schema.EXAMPLES_SIGNATURE: module.serve_examples.get_concrete_function(),
    })
    return path
