"""NVML, the NVIDIA driver's management library: one session helper that preflight's GPU check and
the training run's GPU sampler share."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def nvml_session():
    """Yields (pynvml, None) with NVML initialized, or (None, reason) when it cannot be."""
    try:
        import pynvml
    except ImportError:
        yield None, "nvidia-ml-py is not installed"
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        yield None, f"NVML unavailable: {e} (no NVIDIA driver on this machine)"
        return
    try:
        yield pynvml, None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def query(nvml, call, *args):
    """One NVML call; None when the device does not support it (many fields are optional)."""
    try:
        value = getattr(nvml, call)(*args)
    except nvml.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value
