"""The networks `stoke train` can fit, all taking uint8 [N, S, S, 3] images and returning logits.

Each model starts with the rescaling its architecture expects, so the input pipeline and the serving
signature hand over raw pixels and never need to know which network is behind them. Augmentation
(random crop, flip) happens in the input pipeline on the CPU, where it is nearly free.

The logits layer computes in float32 under mixed precision: a float16 softmax over many classes
underflows, and the loss must see float32 values.
"""
from __future__ import annotations

import tf_keras as keras

from components.contracts.config import MODEL_NAMES

# Caffe-style ImageNet means (BGR) that keras.applications' ResNet50 weights were trained with.
RESNET_MEANS_BGR = (103.939, 116.779, 123.68)


def build_model(name: str, num_classes: int, image_size: int, weights: str = "none") -> keras.Model:
    """A Keras model under the current global mixed-precision policy."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if weights not in ("none", "imagenet"):
        raise ValueError(f"unknown weights {weights!r}: use none or imagenet")
    if name == "small_cnn" and weights == "imagenet":
        raise ValueError("small_cnn has no ImageNet weights; use --weights none")
    inputs = keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
    shape = (image_size, image_size, 3)
    init = None if weights == "none" else "imagenet"
    if name == "small_cnn":
        features = _small_cnn(keras.layers.Rescaling(1.0 / 255, name="rescale")(inputs))
    elif name == "mobilenet_v3_small":
        # The application rescales 0..255 itself (include_preprocessing); only the dtype changes here.
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        features = keras.applications.MobileNetV3Small(
            input_shape=shape, include_top=False, weights=init, pooling="avg",
            include_preprocessing=True)(pixels)
    elif name == "efficientnet_b0":
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        features = keras.applications.EfficientNetB0(
            input_shape=shape, include_top=False, weights=init, pooling="avg")(pixels)
    else:
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        bgr = keras.layers.Lambda(_caffe_preprocess, name="caffe_preprocess")(pixels)
        features = keras.applications.ResNet50(
            input_shape=shape, include_top=False, weights=init, pooling="avg")(bgr)
    features = keras.layers.Dropout(0.2, name="dropout")(features)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(features)
    return keras.Model(inputs, logits, name=name)


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


def compile_model(model: keras.Model, learning_rate: float, jit_compile: bool, steps_per_execution: int):
    """Adam + sparse cross-entropy on logits; tf_keras wraps the optimizer in a LossScaleOptimizer
    by itself when the policy is mixed_float16."""
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model
