"""The weights a run starts from: none, a local Keras .h5 file, or keras.applications' ImageNet weights.

Settled with the plan (components/train/plan.py), once the spans are found and before any shard is
staged or dataset built: a run that cannot have its weights stops in seconds with one line naming the
ways out, instead of after staging shards or, worse, training from scratch a network that needs
millions of images. ImageNet weights come from the Keras cache
when a copy there matches keras.applications' hash (trusted on the hash, not on the name), else from
keras.applications' own address, with a socket timeout: a machine behind a firewall that drops
packets waits seconds, not the minutes of the system's default.
"""
from __future__ import annotations

import hashlib
import os
import socket

from components.common.files import is_uri
from components.train.plan import TrainError

# Seconds any one connect or read of the download may block.
FETCH_TIMEOUT_SECONDS = 5.0
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
WAYS_OUT = ("train offline: set train.weights to a local Keras .h5 such as {file} (the file keras.applications "
            "downloads into ~/.keras/models) or to none (from scratch), or use the cpu preset (a small network from "
            "scratch, minutes on a CPU): stoke train --weights PATH, --weights none or --preset cpu; stoke run "
            "--set train.weights=PATH, --set train.weights=none or --preset cpu")


def initial_weights(weights: str | None, network: str, timeout: float = FETCH_TIMEOUT_SECONDS) -> str | None:
    """None (from scratch) or the local .h5 file `network` starts from; a TrainError saying why not."""
    if weights is None:
        raise TrainError("train.weights is unset: none, imagenet or the path of a Keras .h5 file (a preset fills it)")
    if weights == "none":
        return None
    if weights == "imagenet":
        if network not in IMAGENET:
            raise TrainError(f"{network} has no ImageNet weights; use --weights none or a weights file")
        return imagenet_file(network, timeout)
    if is_uri(weights) or not os.path.isfile(weights):
        raise TrainError(f"--weights {weights}: no such local file (use none, imagenet or the path of a Keras "
                         ".h5 weights file)")
    if not weights.endswith(".h5"):
        raise TrainError(f"--weights {weights}: not a Keras .h5 weights file")
    return weights


def keras_homes() -> list[str]:
    """Where Keras keeps its cache: $KERAS_HOME, else ~/.keras; then /tmp/.keras, where tf_keras puts
    its downloads when that is not writable."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return [home] if os.access(home, os.W_OK) else [home, os.path.join("/tmp", ".keras")]


def imagenet_file(network: str, timeout: float = FETCH_TIMEOUT_SECONDS, origin: str | None = None) -> str:
    """The cached copy of `network`'s ImageNet weights that matches their hash, else a fresh download."""
    import tf_keras as keras

    name, base, md5 = IMAGENET[network]
    for home in keras_homes():
        path = os.path.join(home, "models", name)
        if os.path.isfile(path) and _md5(path) == md5:
            return path
    origin = origin or base + name
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        return keras.utils.get_file(name, origin, cache_dir=keras_homes()[0], cache_subdir="models", file_hash=md5)
    except Exception as exc:  # urllib's and get_file's errors, all of them: one line for the user either way
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainError(f"train.weights imagenet: {network}'s ImageNet weights are not in the Keras cache "
                         f"({os.path.join(keras_homes()[0], 'models', name)}) and could not be fetched from {origin} "
                         f"({reason}); " + WAYS_OUT.format(file=name)) from None
    finally:
        socket.setdefaulttimeout(previous)


def _md5(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
