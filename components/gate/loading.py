"""The gate's models when TensorFlow cannot load them: which one, and why, in one line.

A damaged model (weights cut short, a saved_model.pb that is no SavedModel, a model without the
`examples` signature the gate evaluates through) fails deep inside TFMA's Beam workers or the paired
comparison, as whatever those re-raise. Each evaluation runs under `named_unloadable`, which on a
failure loads each model once more, alone, and turns the failure into a GateError naming the models
that do not load and what to do; a failure every model survives is left as it was.
"""
from __future__ import annotations

import contextlib

from components.contracts import schema


@contextlib.contextmanager
def named_unloadable(models: dict[str, tuple[str, str]], refuse):
    """Runs the block; a failure that one of `models` (what to call it -> its local path and what to
    do about it) explains becomes `refuse(message)`. A `refuse` raised inside passes as it is."""
    try:
        yield
    except Exception as error:
        if isinstance(error, refuse):
            raise
        bad = [f"{name} cannot be loaded ({why}); {remedy}"
               for name, (path, remedy) in models.items() if (why := load_problem(path))]
        if not bad:
            raise
        raise refuse("; ".join(bad)) from None


def load_problem(path: str) -> str | None:
    """Why TensorFlow cannot load the SavedModel at `path` for the gate, or None when it can."""
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(path)
    except Exception as error:  # the loader raises what the damage makes of it: IndexError, DecodeError, OpError...
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__
    if schema.EXAMPLES_SIGNATURE not in loaded.signatures:
        return f"it has no {schema.EXAMPLES_SIGNATURE!r} signature, which the gate evaluates through"
    return None
