"""A keras.applications backbone with a head of your own, fine-tuned from ImageNet weights.

Beside your run configuration, name it `train.network: backbone_head.py:network` with `train.weights:
imagenet` (or the path of a local *_notop.h5). The function returns the model and its backbone: Stoke
trains the head alone first, the backbone frozen, then fine-tunes all of it at train.fine_tune_learning_rate.
"""
import tf_keras as keras


def network(num_classes: int, image_size: int, weights: str | None):
    inputs = keras.Input((image_size, image_size, 3), dtype="uint8")  # raw pixels, as Stoke hands them over
    pixels = keras.layers.Rescaling(1.0)(inputs)  # to float: MobileNetV3 rescales 0..255 itself
    backbone = keras.applications.MobileNetV3Small(
        input_shape=(image_size, image_size, 3), include_top=False, weights=weights, pooling="avg")
    # From weights, batch norm keeps the statistics it learnt on ImageNet, also while the backbone is fine-tuned.
    x = backbone(pixels, training=False) if weights else backbone(pixels)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dropout(0.3)(x)
    logits = keras.layers.Dense(num_classes)(x)  # under mixed precision Stoke computes it in float32
    return keras.Model(inputs, logits, name="backbone_head"), backbone
