"""The networks `stoke train` can fit, all taking uint8 [N, S, S, 3] images and returning logits.

Each model starts with the rescaling its architecture expects, so the input pipeline and the serving
signature hand over raw pixels and never need to know which network is behind them. Augmentation
(random crop, flip) happens in the input pipeline on the CPU, where it is nearly free.

The logits layer computes in float32 under mixed precision: a float16 softmax over many classes
underflows, and the loss must see float32 values.
"""
from __future__ import annotations

import os

import tf_keras as keras

from components.common.files import is_uri
from components.contracts.config import NETWORKS

# Caffe-style ImageNet means (BGR) that keras.applications' ResNet50 weights were trained with.
RESNET_MEANS_BGR = (103.939, 116.779, 123.68)


def build_model(name: str, num_classes: int, image_size: int, weights: str = "none") -> keras.Model:
    """A Keras model under the current global mixed-precision policy."""
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; choose one of {', '.join(NETWORKS)}")
    init = _initial_weights(weights)
    if name == "small_cnn" and init == "imagenet":
        raise ValueError("small_cnn has no ImageNet weights; use --weights none or a weights file")
    inputs = keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
    shape = (image_size, image_size, 3)
    if name == "small_cnn":
        features = _small_cnn(keras.layers.Rescaling(1.0 / 255, name="rescale")(inputs))
    elif name == "mobilenet_v3_small":
        # The application rescales 0..255 itself (include_preprocessing); only the dtype changes here.
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        features = _load(lambda: keras.applications.MobileNetV3Small(
            input_shape=shape, include_top=False, weights=init, pooling="avg",
            include_preprocessing=True), init)(pixels)
    elif name == "efficientnet_b0":
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        features = _load(lambda: keras.applications.EfficientNetB0(
            input_shape=shape, include_top=False, weights=init, pooling="avg"), init)(pixels)
    else:
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        bgr = keras.layers.Lambda(_caffe_preprocess, name="caffe_preprocess")(pixels)
        features = _load(lambda: keras.applications.ResNet50(
            input_shape=shape, include_top=False, weights=init, pooling="avg"), init)(bgr)
    features = keras.layers.Dropout(0.2, name="dropout")(features)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(features)
    model = keras.Model(inputs, logits, name=name)
    if name == "small_cnn" and init:
        # A file of a whole small_cnn (an earlier run's, say): layers match by name, the logits
        # of another number of classes are left as initialised.
        _load(lambda: model.load_weights(init, by_name=True, skip_mismatch=True), init)
    return model


def _initial_weights(weights: str) -> str | None:
    """None, "imagenet" or the path of a local weights file."""
    if weights == "none":
        return None
    if weights == "imagenet":
        return weights
    if is_uri(weights) or not os.path.isfile(weights):
        raise ValueError(f"--weights {weights}: no such local file (use none, imagenet or the path of a Keras "
                         ".h5 weights file)")
    if not weights.endswith(".h5"):
        raise ValueError(f"--weights {weights}: not a Keras .h5 weights file")
    return weights


def _load(load, path: str | None):
    """Runs `load`; a weights file that does not fit the network is a one-line error."""
    if path in (None, "imagenet"):
        return load()
    try:
        return load()
    except (ValueError, OSError) as exc:
        raise ValueError(f"--weights {path} does not fit this model: {str(exc).splitlines()[0]}") from None


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
    import tensorflow as tf

    return x[..., ::-1] - tf.constant(RESNET_MEANS_BGR, dtype=x.dtype)


def compile_model(model: keras.Model, optimizer, loss, jit_compile: bool, steps_per_execution: int):
    """The recipe's optimizer and loss (components/train/recipe.py); tf_keras wraps the optimizer in
    a LossScaleOptimizer by itself when the policy is mixed_float16. Accuracy is a weighted metric:
    tf_keras hands plain `metrics` no sample weights, and evaluation's blanks weigh 0."""
    model.compile(
        optimizer=optimizer,
        loss=loss,
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model
