"""The networks `stoke train` can fit, all taking uint8 [N, S, S, 3] images and returning logits.

Each model starts with the rescaling its architecture expects, so the input pipeline and the serving
signature hand over raw pixels and never need to know which network is behind them. Augmentation
(random crop, flip) happens in the input pipeline on the CPU, where it is nearly free.

The logits layer computes in float32 under mixed precision: a float16 softmax over many classes
underflows, and the loss must see float32 values.
"""
from __future__ import annotations

import tf_keras as keras

from components.contracts.config import NETWORKS

# Caffe-style ImageNet means (BGR) that keras.applications' ResNet50 weights were trained with.
RESNET_MEANS_BGR = (103.939, 116.779, 123.68)


def build_model(name: str, num_classes: int, image_size: int, weights: str | None = None,
                fine_tuning: bool = False) -> keras.Model:
    """A Keras model under the current global mixed-precision policy, from `weights` (a local .h5
    file, components/train/weights.py) or from scratch. `fine_tuning` runs the backbone's batch
    normalization in inference mode for good (components/train/phases.py says why)."""
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
