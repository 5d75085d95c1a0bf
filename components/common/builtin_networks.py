"""The networks Stoke names itself, and keras.applications' by name, written to the contract every network
keeps (components/common/networks.py): a function of the number of classes, the image size and the weights
(None, "imagenet" or a local .h5 file) that returns a Keras model from uint8 [N, S, S, 3] to logits, with
its pretrained backbone beside it when it has one.

Each starts with the rescaling its architecture expects, so the input pipeline and the serving signature
hand over raw pixels and never need to know which network is behind them. Augmentation (random crop, flip)
happens in the input pipeline on the CPU, where it is nearly free. The logits layer computes in float32
under mixed precision: a float16 softmax over many classes underflows, and the loss must see float32 values.
A backbone started from weights runs its batch normalization in inference mode for good (components/train/
recipe.py says why); from scratch, it learns its statistics.
"""
from __future__ import annotations

import contextlib
import socket
import sys

import tensorflow as tf
import tf_keras as keras

# Caffe-style ImageNet means (BGR) that keras.applications' ResNet50 weights were trained with.
RESNET_MEANS_BGR = (103.939, 116.779, 123.68)
# Seconds any one connect or read of keras.applications' own download of ImageNet weights may block: a machine
# behind a firewall that drops packets waits seconds, not the minutes of the system's default.
FETCH_TIMEOUT_SECONDS = 5.0


def small_cnn(num_classes: int, image_size: int, weights: str | None = None) -> keras.Model:
    """Three strided conv blocks: fast enough for tests and small data such as the demo digits. `weights`: a
    file of a whole small_cnn (an earlier run's, say): layers match by name, the logits of another number of
    classes are left as initialised."""
    inputs = keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
    x = keras.layers.Rescaling(1.0 / 255, name="rescale")(inputs)
    for index, filters in enumerate((32, 64, 128)):
        x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False, name=f"conv{index}")(x)
        # Momentum 0.9, not Keras' 0.99: small data means few steps, and with 0.99 the moving
        # variance is still mostly its initial 1.0 after a few hundred steps, which wrecks inference.
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"bn{index}")(x)
        x = keras.layers.ReLU(name=f"relu{index}")(x)
    model = with_head(inputs, keras.layers.GlobalAveragePooling2D(name="pool")(x), num_classes, "small_cnn")
    if weights:
        loading(lambda: model.load_weights(weights, by_name=True, skip_mismatch=True), weights)
    return model


def _backbone(name: str, make, caffe: bool = False):
    """A built-in network on a keras.applications backbone, pooled to one feature vector, then the head."""
    def network(num_classes: int, image_size: int, weights: str | None = None):
        inputs = keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
        # These applications rescale 0..255 themselves (ResNet50 after the Caffe means); only the dtype changes here.
        pixels = keras.layers.Rescaling(1.0, name="to_float")(inputs)
        if caffe:
            pixels = keras.layers.Lambda(_caffe_preprocess, name="caffe_preprocess")(pixels)
        base = loading(lambda: make((image_size, image_size, 3), weights), weights)
        features = base(pixels, training=False) if weights else base(pixels)
        return with_head(inputs, features, num_classes, name), base
    network.__name__ = name
    return network


def _caffe_preprocess(x):
    return x[..., ::-1] - tf.constant(RESNET_MEANS_BGR, dtype=x.dtype)


BUILTIN = {
    "small_cnn": small_cnn,
    "mobilenet_v3_small": _backbone("mobilenet_v3_small", lambda shape, weights: keras.applications.MobileNetV3Small(
        input_shape=shape, include_top=False, weights=weights, pooling="avg", include_preprocessing=True)),
    "efficientnet_b0": _backbone("efficientnet_b0", lambda shape, weights: keras.applications.EfficientNetB0(
        input_shape=shape, include_top=False, weights=weights, pooling="avg")),
    "resnet50": _backbone("resnet50", lambda shape, weights: keras.applications.ResNet50(
        input_shape=shape, include_top=False, weights=weights, pooling="avg"), caffe=True),
}


def application(name: str):
    """keras.applications.<name> as a network: its own preprocessing (its module's preprocess_input), the
    backbone pooled to one feature vector, the head; and the file of tf_keras' code it builds. A KeyError for a
    name keras.applications does not have."""
    make = getattr(keras.applications, name, None) if name[:1].isupper() else None
    if not callable(make) or not make.__module__.startswith("tf_keras.src.applications."):
        raise KeyError(name)
    preprocess = sys.modules[make.__module__].preprocess_input

    def network(num_classes: int, image_size: int, weights: str | None = None):
        inputs = keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
        pixels = keras.layers.Lambda(preprocess, name="preprocess")(keras.layers.Rescaling(1.0, name="to_float")(inputs))
        with fetch_timeout():
            base = loading(lambda: make(input_shape=(image_size, image_size, 3), include_top=False, weights=weights,
                                        pooling="avg"), weights)
        features = base(pixels, training=False) if weights else base(pixels)
        return with_head(inputs, features, num_classes, f"keras_applications_{name}"), base
    return network, sys.modules[make.__module__].__file__


def with_head(inputs, features, num_classes: int, name: str) -> keras.Model:
    """Dropout, then the logits in float32, on one feature vector per image."""
    features = keras.layers.Dropout(0.2, name="dropout")(features)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(features)
    return keras.Model(inputs, logits, name=name)


def loading(load, path: str | None):
    """Runs `load`; a weights file that does not fit the network is a one-line error."""
    if path in (None, "imagenet"):
        return load()
    try:
        return load()
    except (ValueError, OSError) as exc:
        raise ValueError(f"train.weights {path} does not fit this model: {str(exc).splitlines()[0]}") from None


@contextlib.contextmanager
def fetch_timeout(seconds: float = FETCH_TIMEOUT_SECONDS):
    """A download of ImageNet weights in the block gives up after `seconds` of silence on any one connect or read."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)
