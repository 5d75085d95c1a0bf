"""The one way a network enters training, and what it is: its code, loaded, with the SHA-256 of that code.

A network is a function `network(num_classes, image_size, weights)` that returns a tf_keras model from uint8
images [N, image_size, image_size, 3] to logits [N, num_classes], or that model and its pretrained backbone (a
layer of it, or that layer's name), which the recipe freezes while the new head learns (components/train/
recipe.py). `weights` is None (from scratch), "imagenet" or the path of a local .h5 file: the train.weights
setting as keras.applications take it. The built-in networks and keras.applications' are such functions
(components/common/builtin_networks.py); the user's own is `module:function` or `path/to/file.py:function`
(components/common/network_code.py finds the file). Everything else is Stoke's, the same for every network:
the strategy, mixed precision, XLA, the recipe, the input pipeline, the export and its serving signature.

`build` holds each model to that contract: a tf_keras functional model (its input a keras.Input), uint8 in,
one logit a class out, and the logits in float32. Under mixed precision a last layer that computes them in
float16 or bfloat16 is rebuilt in float32 there, with its weights, as Keras' mixed precision guide has the
model's output layer; one that cannot be (its weights kept in float16, a layer that cannot be made from its
config) is refused, naming it. Every refusal is a NetworkError of one line that names the network by its
identity (network_code.identity).

A network's code is its identity's other half: the SHA-256 of its file (what `sha256sum` prints), or of the
files of its module's package; of Stoke's own file for a built-in one, and of tf_keras' file beside it for a
keras.applications one. A run keeps a copy of the user's code in its folder (`keep`); the SavedModel it exports
needs none of it: TF Serving loads the graph.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import posixpath
import sys
import types
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tf_keras as keras

from components.common import builtin_networks, network_code
from components.common.files import exists, join, read_bytes, write_whole
from components.contracts.config import network_parts
from components.contracts.layout import RunDir

# The attribute of a built model that names its pretrained backbone (a str: Keras tracks no checkpoint edge for it).
BACKBONE = "stoke_backbone"
# A module network's package is copied into every run folder: one this large is a library, not a network.
MAX_PACKAGE_FILES, MAX_PACKAGE_BYTES = 500, 16 * 1024 * 1024


class NetworkError(ValueError):
    """A network that cannot be loaded or does not keep the contract; the message is one line naming it."""


@dataclasses.dataclass(frozen=True)
class Code:
    reference: str  # train.network, located
    identity: str  # network_code.identity: the name it is known by across runs
    digest: str  # the SHA-256 of its code
    function: Callable
    files: tuple[tuple[str, bytes], ...]  # what a run keeps in code/ (name, bytes); none for Stoke's and Keras' own


def load(reference: str) -> Code:
    """The network `reference` names, its code loaded (a module imported, a file run) and fingerprinted. Errors
    name it by its identity, which is the file's name for a file (the message names the file where it matters)."""
    kind, where, function = network_parts(reference)
    named = network_code.identity(reference)
    if kind == "builtin":
        return _code(reference, builtin_networks.BUILTIN[where], [_source(builtin_networks.__file__)], keep=False)
    if kind == "application":
        try:
            network, keras_file = builtin_networks.application(where)
        except KeyError:
            raise NetworkError(f"train.network {named}: keras.applications has no network {where}") from None
        return _code(reference, network, [_source(builtin_networks.__file__), _source(keras_file)], keep=False)
    if kind == "module":
        module = _imported(named, where)
        return _code(reference, _function(named, module, function), _package(named, module), keep=True)
    try:
        name, data = network_code.code_of(reference)
    except ValueError as error:
        raise NetworkError(str(error)) from None
    module = _run_file(named, where, data)
    return _code(reference, _function(named, module, function), [(name, data)], keep=True)


def _code(reference: str, function: Callable, files: list[tuple[str, bytes]], keep: bool) -> Code:
    if len(files) == 1:
        digest = hashlib.sha256(files[0][1]).hexdigest()
    else:
        digest = hashlib.sha256(b"".join(name.encode() + b"\0" + hashlib.sha256(data).digest()
                                         for name, data in sorted(files))).hexdigest()
    return Code(reference=reference, identity=network_code.identity(reference), digest=digest, function=function,
                files=tuple(files) if keep else ())


def _source(path: str) -> tuple[str, bytes]:
    with open(path, "rb") as f:
        return os.path.basename(path), f.read()


def _imported(named: str, module: str) -> types.ModuleType:
    try:
        return importlib.import_module(module)
    except (Exception, SystemExit) as error:  # the user's code: whatever its import raises is this one line
        raise NetworkError(f"train.network {named}: module {module} does not import ({_said(error)})") from None


def _run_file(named: str, where: str, data: bytes) -> types.ModuleType:
    """The file run as a module of its own, named by its digest (run once per process for the same bytes)."""
    name = f"stoke_network_{hashlib.sha256(data).hexdigest()[:16]}"
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__file__ = where
        sys.modules[name] = module  # as an import has it while the module runs (dataclasses look it up)
        try:
            exec(compile(data, where, "exec"), module.__dict__)
        except (Exception, SystemExit) as error:
            del sys.modules[name]
            raise NetworkError(f"train.network {named}: {where} does not run ({_said(error)})") from None
    return sys.modules[name]


def _function(named: str, module: types.ModuleType, function: str) -> Callable:
    found = getattr(module, function, None)
    if not callable(found):
        raise NetworkError(f"train.network {named}: {getattr(module, '__file__', None) or module.__name__} has "
                           f"no function {function}")
    return found


def _package(named: str, module: types.ModuleType) -> list[tuple[str, bytes]]:
    """The files of the package `module` belongs to (each .py below its top folder), or its own file."""
    top = sys.modules[module.__name__.split(".")[0]]
    folders = list(getattr(top, "__path__", []))
    if not folders:
        if not getattr(top, "__file__", None):
            raise NetworkError(f"train.network {named}: module {top.__name__} has no source file to record")
        return [_source(top.__file__)]
    files, size = [], 0
    for folder in folders:
        for parent, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(parent, name)
                files.append((posixpath.join(top.__name__, *os.path.relpath(path, folder).split(os.sep)),
                              _source(path)[1]))
                size += len(files[-1][1])
                if len(files) > MAX_PACKAGE_FILES or size > MAX_PACKAGE_BYTES:
                    raise NetworkError(f"train.network {named}: package {top.__name__} is over {MAX_PACKAGE_FILES} "
                                       f"files or {MAX_PACKAGE_BYTES // 2**20} MB, and a run keeps a copy of a "
                                       "network's package: give the network a package of its own")
    return files


def build(code: Code, num_classes: int, image_size: int, weights: str | None) -> keras.Model:
    """The network's model for `num_classes` at `image_size` from `weights`, under the current global policy,
    held to the contract (its logits made float32 where they can be); its backbone named by `backbone(model)`."""
    try:
        made = code.function(num_classes, image_size, weights)
    except NetworkError:
        raise
    except Exception as error:  # the user's code: whatever it raises is this one line
        raise NetworkError(f"train.network {code.identity}: building it failed ({_said(error)})") from None
    model, base = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, keras.Model):
        keras3 = type(model).__module__.split(".")[0] == "keras"
        raise NetworkError(f"train.network {code.identity} returned {type(made).__name__}, not a Keras model: return "
                           "a tf_keras model (or the model and its backbone)" + (
                               "; this is Keras 3's, and training uses tf_keras: import tf_keras as keras" if keras3
                               else ""))
    _check_input(code.identity, model, image_size)
    if len(model.outputs) == 1:
        model = _float32_logits(code.identity, model)
    if len(model.outputs) != 1 or tuple(model.outputs[0].shape.as_list()) != (None, num_classes):
        raise NetworkError(f"train.network {code.identity} returns "
                           f"{_shapes(model.outputs)} for {num_classes} classes: one logit a class, [N, {num_classes}]")
    if base is not None:
        layer = _layer(model, base)
        if layer is None:
            raise NetworkError(f"train.network {code.identity}: the backbone it returned, "
                               f"{getattr(base, 'name', base)}, is not a layer of its model")
        setattr(model, BACKBONE, layer.name)
    return model


def backbone(model: keras.Model):
    """The pretrained part a network's function returned beside its model, or None."""
    name = getattr(model, BACKBONE, None)
    return model.get_layer(name) if name else None


def _check_input(named: str, model: keras.Model, image_size: int) -> None:
    inputs = model.inputs or []
    wanted = (None, image_size, image_size, 3)
    if len(inputs) == 1 and inputs[0].dtype == tf.uint8 and tuple(inputs[0].shape.as_list()) == wanted:
        return
    said = f"takes {_shapes(inputs)}" if inputs else "takes no keras.Input (a subclassed model)"
    raise NetworkError(f"train.network {named} {said}: Stoke hands it uint8 images [N, {image_size}, {image_size}, "
                       f"3]; start it with keras.Input(({image_size}, {image_size}, 3), dtype='uint8') and rescale in "
                       "the model")


def _float32_logits(named: str, model: keras.Model) -> keras.Model:
    """`model`, or the same model with its last layer rebuilt in float32, or a NetworkError naming that layer."""
    output = model.outputs[0]
    if output.dtype == tf.float32:
        return model
    layer, node, _ = output._keras_history
    held = next((w.dtype for w in layer.weights if w.dtype != tf.float32), None)
    fix = "give it dtype='float32' (keras.layers.Dense(num_classes, dtype='float32'))"
    if held is not None:
        raise NetworkError(f"train.network {named}: its last layer {layer.name} keeps its weights in {held.name}, so "
                           f"its logits cannot be made float32; {fix}")
    try:
        config = dict(layer.get_config(), dtype="float32")
        rebuilt = type(layer).from_config(config)
        logits = rebuilt(layer.get_input_at(node))
        rebuilt.set_weights(layer.get_weights())
        model = keras.Model(model.inputs, logits, name=model.name)
    except Exception as error:  # a layer of the user's that cannot be made from its config: refused as it is
        raise NetworkError(f"train.network {named}: its last layer {layer.name} computes the logits in "
                           f"{output.dtype.name} and cannot be rebuilt in float32 ({_said(error)}); {fix}") from None
    if model.outputs[0].dtype != tf.float32:
        raise NetworkError(f"train.network {named}: its last layer {layer.name} still computes the logits in "
                           f"{model.outputs[0].dtype.name} when rebuilt in float32; {fix}")
    return model


def _layer(model: keras.Model, base):
    if isinstance(base, str):
        return next((layer for layer in model.layers if layer.name == base), None)
    return next((layer for layer in model.layers if layer is base), None)


def _shapes(tensors) -> str:
    return ", ".join(f"{t.dtype.name} {t.shape.as_list()}" for t in tensors)


def _said(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def forward(code: Code, num_classes: int, image_size: int, weights: str | None, policy: str) -> keras.Model:
    """The model built under `policy` and run on one batch on the CPU, as preflight tries a network before any
    data is read; a NetworkError when it does not keep the contract."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        with tf.device("/CPU:0"):
            model = build(code, num_classes, image_size, weights)
            images = np.random.default_rng(0).integers(0, 256, (2, image_size, image_size, 3), dtype=np.uint8)
            try:
                logits = model(images, training=False)
            except Exception as error:
                raise NetworkError(f"train.network {code.identity}: one batch through it failed "
                                   f"({_said(error)})") from None
    finally:
        keras.mixed_precision.set_global_policy(previous)
    if logits.dtype != tf.float32 or tuple(logits.shape) != (2, num_classes):
        raise NetworkError(f"train.network {code.identity}: one batch of 2 gave {logits.dtype.name} "
                           f"{logits.shape.as_list()}, not float32 [2, {num_classes}]")
    return model


def keep(code: Code, run: RunDir) -> None:
    """The user's code into the run folder's code/, where it is not there already (a flow run's file network)."""
    for name, data in code.files:
        target = join(run.code, name)
        if not exists(target) or read_bytes(target) != data:
            write_whole(target, data)
