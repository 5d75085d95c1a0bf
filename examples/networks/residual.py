"""A small residual network of your own, trained from scratch.

Beside your run configuration, name it `train.network: residual.py:network`. Stoke calls
`network(num_classes, image_size, weights)` and trains the tf_keras model it returns: uint8 images
[N, image_size, image_size, 3] in, one logit a class out. The rest is Stoke's, as for a built-in network.
"""
import tf_keras as keras


def block(x, filters: int, stride: int):
    """Two 3x3 convolutions and a shortcut around them (He et al. 2016, "Deep Residual Learning")."""
    shortcut = x
    x = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization(momentum=0.9)(x))
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=0.9)(x)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = keras.layers.BatchNormalization(momentum=0.9)(shortcut)
    return keras.layers.ReLU()(keras.layers.Add()([x, shortcut]))


def network(num_classes: int, image_size: int, weights: str | None):
    if weights is not None:
        raise ValueError("residual.py trains from scratch: set train.weights to none")
    inputs = keras.Input((image_size, image_size, 3), dtype="uint8")  # raw pixels, as Stoke hands them over
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization(momentum=0.9)(x))
    for filters, stride in ((32, 1), (64, 2), (128, 2)):
        x = block(x, filters, stride)
    x = keras.layers.GlobalAveragePooling2D()(x)
    # Logits, not probabilities; under mixed precision Stoke computes this layer in float32.
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="residual")
