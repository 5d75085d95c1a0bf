"""The network a run will train, tried before any data is read: its code imported (a module) or run (a file),
the network built for the run's classes and size through the one contract every network keeps
(components/common/networks.py), and one batch of uint8 images through it on the CPU. A module that does not
import, a function that returns no Keras model, logits of the wrong width, a model that wants float inputs, a
last layer whose float16 logits cannot be made float32, a weights file that is not there: each fails here, in
one line naming the reference, instead of after ingest. A settings problem: the preflight program exits 2.

The classes are those ROOT knows (labels.json); before the first span, FIRST_CLASSES stands in for them.
Under mixed precision (train.precision other than float32: `auto` picks it on a GPU) the network is built as
in mixed_bfloat16, which any CPU runs: the rule for float32 logits is the same in float16.
"""
from __future__ import annotations

import os

from components.common import network_code
from components.common.files import is_uri
from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.preflight.checks import Check
from components.preflight.weights import imagenet_network

NAME = "network"
FIRST_CLASSES = 2


def network_check(train: TrainConfig, root: str) -> Check:
    if not train.network or not train.image_size:
        return Check(NAME, "skip", "train.network or train.image_size is unset (a preset fills them)")
    # tf.keras means Keras 2, tf_keras, for a network's code that reaches for it, as in training; this works before
    # TensorFlow is imported, which is here (the flow imports this module for its name, and imports no TensorFlow).
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    from components.common import networks

    weights = _weights(train)
    if weights is not None and weights != "imagenet" and (is_uri(weights) or not os.path.isfile(weights)):
        return Check(NAME, "fail", f"train.network {network_code.identity(train.network)}: train.weights {weights}: "
                     "no such local file", facts={"settings": True})
    classes = len(Spans(root).read_labels()) or FIRST_CLASSES
    policy = "float32" if train.precision == "float32" else "mixed_bfloat16"
    try:
        code = networks.load(train.network)
        model = networks.forward(code, classes, train.image_size, weights, policy)
    except networks.NetworkError as error:
        return Check(NAME, "fail", str(error), facts={"settings": True})
    return Check(NAME, "ok", f"{code.identity} (SHA-256 {code.digest[:12]}) builds for {classes} classes at "
                 f"{train.image_size} px in {policy} and answers a batch: {model.count_params():,} parameters",
                 facts={"identity": code.identity, "digest": code.digest})


def _weights(train: TrainConfig) -> str | None:
    """The weights the network is built from here: a weights file as training has it; ImageNet's only for a network
    of the user's, which fetches its own (a built-in network's are the ImageNet weights check's to find)."""
    if train.weights in (None, "none") or imagenet_network(train):
        return None
    return train.weights
