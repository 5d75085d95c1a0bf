"""keras.applications' ImageNet weights on this machine: which file each network starts from, and whether
the Keras cache holds a copy that can be trusted. Training uses it before it downloads anything, and
preflight can say before ingest runs whether a run configured for `imagenet` will have its weights.

Nothing here downloads or imports TensorFlow: a lookup is a stat and an MD5 of one file.
"""
from __future__ import annotations

import hashlib
import os

# Where keras.applications keeps the ImageNet weights without the classifier (include_top=False): the
# file name, its address and MD5, as tf_keras' applications name them.
IMAGENET = {
    "mobilenet_v3_small": ("weights_mobilenet_v3_small_224_1.0_float_no_top_v2.h5",
                           "https://storage.googleapis.com/tensorflow/keras-applications/mobilenet_v3/",
                           "d3e8ec802a04aa4fc771ee12a9a9b836"),
    "efficientnet_b0": ("efficientnetb0_notop.h5", "https://storage.googleapis.com/keras-applications/",
                        "50bc09e76180e00e4465e1a485ddc09d"),
    "resnet50": ("resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
                 "https://storage.googleapis.com/tensorflow/keras-applications/resnet/",
                 "4d473c1dd8becc155b73f8504c6f6626"),
}

# What a run without its ImageNet weights can do instead (training's error and preflight's fix say it).
WAYS_OUT = ("train offline: set train.weights to a local Keras .h5 such as {file} (the file keras.applications "
            "downloads into ~/.keras/models) or to none (from scratch), or use the cpu preset (a small network from "
            "scratch, minutes on a CPU): stoke train --weights PATH, --weights none or --preset cpu; stoke run "
            "--set train.weights=PATH, --set train.weights=none or --preset cpu")


def keras_homes() -> list[str]:
    """Where Keras keeps its cache: $KERAS_HOME, else ~/.keras; then /tmp/.keras, where tf_keras puts
    its downloads when that is not writable."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return [home] if os.access(home, os.W_OK) else [home, os.path.join("/tmp", ".keras")]


def cache_path(network: str) -> str:
    """Where `network`'s ImageNet weights would be in the Keras cache (the first place Keras looks)."""
    return os.path.join(keras_homes()[0], "models", IMAGENET[network][0])


def cached_file(network: str) -> str | None:
    """The copy of `network`'s ImageNet weights in the Keras cache whose MD5 is keras.applications' (a file
    is trusted on its hash, not on its name); None when there is none. KeyError for a network without any."""
    name, _, md5 = IMAGENET[network]
    for home in keras_homes():
        path = os.path.join(home, "models", name)
        if os.path.isfile(path) and file_md5(path) == md5:
            return path
    return None


def file_md5(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
