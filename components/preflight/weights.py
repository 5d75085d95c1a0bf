"""Whether the ImageNet weights a run starts from can be had: from the Keras cache (a copy whose MD5 is
keras.applications'), else from keras.applications' address, asked once with a HEAD request. Training
would find out only after ingest and the data check; a machine behind a firewall learns it here.
"""
from __future__ import annotations

import urllib.request

from components.common import pretrained
from components.contracts.config import APPLICATIONS, TrainConfig, network_parts
from components.preflight.checks import Check

NAME = "ImageNet weights"
TIMEOUT_SECONDS = 5.0  # as training's download: a firewall that drops packets costs seconds, not minutes


def imagenet_network(train: TrainConfig) -> str | None:
    """The network whose ImageNet weights training loads itself (train.weights imagenet, a built-in network or one of
    keras.applications'), or None: weights none or a local .h5 file, or a network of the user's code, which fetches
    its own as it is built (the network check builds it). `train` is train's settings with the preset filled."""
    if train.weights == "imagenet" and network_parts(train.network)[0] in ("builtin", "application"):
        return train.network
    return None


def imagenet_check(network: str, timeout: float = TIMEOUT_SECONDS) -> Check:
    if network.startswith(APPLICATIONS):
        return Check(NAME, "skip", f"{network} fetches its ImageNet weights into the Keras cache as training builds it")
    if network not in pretrained.IMAGENET:
        return Check(NAME, "fail", f"train.network {network} has no ImageNet weights",
                     "set train.weights to none or to a local Keras .h5 file")
    name, base, _ = pretrained.IMAGENET[network]
    cached = pretrained.cached_file(network)
    if cached:
        return Check(NAME, "ok", f"{network}'s in the Keras cache ({cached})")
    origin = base + name
    try:
        with urllib.request.urlopen(urllib.request.Request(origin, method="HEAD"), timeout=timeout) as answer:
            size = int(answer.headers.get("Content-Length") or 0)
    except (OSError, ValueError) as error:  # URLError, HTTPError, a timeout: the download would fail alike
        reason = getattr(error, "reason", None) or error
        return Check(NAME, "fail", f"{network}'s are not in the Keras cache ({pretrained.cache_path(network)}) and "
                                   f"{origin} cannot be fetched ({reason})", pretrained.WAYS_OUT.format(file=name))
    found = f" ({size / 1e6:.0f} MB)" if size else ""
    return Check(NAME, "ok", f"{network}'s: training downloads them from {origin}{found} into the Keras cache")
