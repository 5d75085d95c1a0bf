"""The networks `stoke train` can fit, the weights they start from, and the candidate SavedModel.

Every network takes uint8 [N, S, S, 3] images and returns logits. Each starts with the rescaling its
architecture expects, so the input pipeline and the serving signature hand over raw pixels and never
need to know which network is behind them. Augmentation (random crop, flip) happens in the input
pipeline on the CPU, where it is nearly free. The logits layer computes in float32 under mixed
precision: a float16 softmax over many classes underflows, and the loss must see float32 values.
"""
from __future__ import annotations

import os
import socket

import tensorflow as tf
import tf_keras as keras

from components.common import pretrained
from components.common.files import is_uri
from components.contracts import schema
from components.contracts.config import NETWORKS
from components.train import TrainError
from components.train.data import decode_eval

# Caffe-style ImageNet means (BGR) that keras.applications' ResNet50 weights were trained with.
RESNET_MEANS_BGR = (103.939, 116.779, 123.68)


def build_model(name: str, num_classes: int, image_size: int, weights: str | None = None,
                fine_tuning: bool = False) -> keras.Model:
    """A Keras model under the current global mixed-precision policy, from `weights` (a local .h5
    file, initial_weights) or from scratch. `fine_tuning` runs the backbone's batch normalization in
    inference mode for good (recipe.py says why)."""
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; choose one of {', '.join(NETWORKS)}")
    inputs = keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
    if name == "small_cnn":
        features = _small_cnn(keras.layers.Rescaling(1.0 / 255, name="rescale")(inputs))
    else:
        # The applications rescale 0..255 themselves (ResNet50 after the Caffe means below); only the dtype changes here.
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        if name == "resnet50":
            pixels = keras.layers.Lambda(_caffe_preprocess, name="caffe_preprocess")(pixels)
        base = _load(lambda: APPLICATIONS[name](shape=(image_size, image_size, 3), weights=weights), weights)
        features = base(pixels, training=False) if fine_tuning else base(pixels)
    features = keras.layers.Dropout(0.2, name="dropout")(features)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(features)
    model = keras.Model(inputs, logits, name=name)
    if name == "small_cnn" and weights:
        # A file of a whole small_cnn (an earlier run's, say): layers match by name, the logits
        # of another number of classes are left as initialised.
        _load(lambda: model.load_weights(weights, by_name=True, skip_mismatch=True), weights)
    return model


# The keras.applications backbones, without their classifier, pooled to one feature vector.
APPLICATIONS = {
    "mobilenet_v3_small": lambda shape, weights: keras.applications.MobileNetV3Small(
        input_shape=shape, include_top=False, weights=weights, pooling="avg", include_preprocessing=True),
    "efficientnet_b0": lambda shape, weights: keras.applications.EfficientNetB0(
        input_shape=shape, include_top=False, weights=weights, pooling="avg"),
    "resnet50": lambda shape, weights: keras.applications.ResNet50(
        input_shape=shape, include_top=False, weights=weights, pooling="avg"),
}


def backbone(model: keras.Model) -> keras.Model | None:
    """The pretrained part of a model build_model made: its keras.applications network (None for small_cnn)."""
    return next((layer for layer in model.layers if isinstance(layer, keras.Model)), None)


def _load(load, path: str | None):
    """Runs `load`; a weights file that does not fit the network is a one-line error."""
    if path is None:
        return load()
    try:
        return load()
    except (ValueError, OSError) as exc:
        raise ValueError(f"train.weights {path} does not fit this model: {str(exc).splitlines()[0]}") from None


def _small_cnn(x):
    """Three strided conv blocks: fast enough for tests and small data such as the demo digits."""
    for index, filters in enumerate((32, 64, 128)):
        x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False, name=f"conv{index}")(x)
        # Momentum 0.9, not Keras' 0.99: small data means few steps, and with 0.99 the moving
        # variance is still mostly its initial 1.0 after a few hundred steps, which wrecks inference.
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"bn{index}")(x)
        x = keras.layers.ReLU(name=f"relu{index}")(x)
    return keras.layers.GlobalAveragePooling2D(name="pool")(x)


def _caffe_preprocess(x):
    return x[..., ::-1] - tf.constant(RESNET_MEANS_BGR, dtype=x.dtype)


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
# training from scratch a network that needs millions of images. ImageNet weights come from the Keras
# cache when a copy there matches keras.applications' hash (components/common/pretrained.py, which
# preflight reads too), else from keras.applications' own address, with a socket timeout: a machine
# behind a firewall that drops packets waits seconds, not the minutes of the system's default.

# Seconds any one connect or read of the download may block.
FETCH_TIMEOUT_SECONDS = 5.0


def initial_weights(weights: str | None, network: str, timeout: float = FETCH_TIMEOUT_SECONDS) -> str | None:
    """None (from scratch) or the local .h5 file `network` starts from; a TrainError saying why not.
    The shape of train.weights (none, imagenet or the path of an .h5 file) is checked by its setting."""
    if weights is None:
        raise TrainError("train.weights is unset: none, imagenet or the path of a Keras .h5 file (a preset fills it)")
    if weights == "none":
        return None
    if weights == "imagenet":
        if network not in pretrained.IMAGENET:
            raise TrainError(f"train.network {network} has no ImageNet weights; set train.weights to none or a "
                             "weights file")
        return imagenet_file(network, timeout)
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
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        return keras.utils.get_file(name, origin, cache_dir=pretrained.keras_homes()[0], cache_subdir="models",
                                    file_hash=md5)
    except Exception as exc:  # urllib's and get_file's errors, all of them: one line for the user either way
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainError(f"train.weights imagenet: {network}'s ImageNet weights are not in the Keras cache "
                         f"({pretrained.cache_path(network)}) and could not be fetched from {origin} "
                         f"({reason}); " + pretrained.WAYS_OUT.format(file=name)) from None
    finally:
        socket.setdefaulttimeout(previous)


# ---------------------------------------------------------------- the candidate SavedModel
# float32, no XLA, the serving signature of DESIGN.md plus one for TFMA.
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
