"""Watches the GPUs while a model trains: utilization, memory and PCIe traffic every few seconds.

A GPU at 30% utilization with a busy PCIe link is waiting for input; one at 95% is the bottleneck
you paid for. The sampler is a background thread over NVML (nvidia-ml-py), so it costs the
training loop nothing. Samples are plain dicts, ready for metrics.json and a plot:

    with GpuSampler(interval=5) as gpus:
        model.fit(...)
    metrics["gpu"] = gpus.to_dict()

Without a GPU or an NVIDIA driver the sampler records nothing and keeps the reason (metrics.json). It
says so as a warning only when TensorFlow trains on a GPU that NVML cannot watch: on a machine without
one there is nothing to watch, and preflight's GPU check has said what the machine has.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
import threading
import time

from components.common.nvml import nvml_session, query

log = logging.getLogger(__name__)


class GpuSampler:
    """Background NVML sampler; a context manager around a training loop."""

    def __init__(self, interval: float = 5.0, max_samples: int = 200_000):
        self.interval = interval
        self.max_samples = max_samples
        self.available = False
        self.reason: str | None = None
        self.devices: list[dict] = []
        self.samples: list[dict] = []
        self._stack = contextlib.ExitStack()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handles: list = []
        self._start = 0.0

    def __enter__(self) -> GpuSampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._nvml, self.reason = self._stack.enter_context(nvml_session())
        if self._nvml is not None:
            count = query(self._nvml, "nvmlDeviceGetCount") or 0
            found = ((i, query(self._nvml, "nvmlDeviceGetHandleByIndex", i)) for i in range(count))
            self._handles = [(i, handle) for i, handle in found if handle is not None]
            if not self._handles:
                self.reason = "NVML sees no GPU"
        if not self._handles:
            log.log(logging.WARNING if tensorflow_gpus() else logging.INFO, "GPU sampler: %s; recording nothing",
                    self.reason)
            self._stack.close()
            return
        self.available = True
        self.devices = [{"gpu": i, "name": query(self._nvml, "nvmlDeviceGetName", h)}
                        for i, h in self._handles]
        self._start = time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._stack.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        nvml, t = self._nvml, round(time.monotonic() - self._start, 3)
        rows = []
        for index, handle in self._handles:
            rates = query(nvml, "nvmlDeviceGetUtilizationRates", handle)
            memory = query(nvml, "nvmlDeviceGetMemoryInfo", handle)
            # NVML reports PCIe throughput in KB/s over a 20 ms window.
            rx = query(nvml, "nvmlDeviceGetPcieThroughput", handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
            tx = query(nvml, "nvmlDeviceGetPcieThroughput", handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
            rows.append({
                "t": t,
                "gpu": index,
                "utilization_pct": None if rates is None else rates.gpu,
                "memory_util_pct": None if rates is None else rates.memory,
                "memory_used_mb": None if memory is None else round(memory.used / 2**20, 1),
                "memory_total_mb": None if memory is None else round(memory.total / 2**20, 1),
                "pcie_rx_mbps": None if rx is None else round(rx / 1000, 2),
                "pcie_tx_mbps": None if tx is None else round(tx / 1000, 2),
            })
        with self._lock:
            if len(self.samples) + len(rows) <= self.max_samples:
                self.samples.extend(rows)

    def summary(self) -> list[dict]:
        """Per device: mean and peak utilization, peak memory, mean PCIe traffic."""
        with self._lock:
            samples = list(self.samples)
        out = []
        for device in self.devices:
            mine = [s for s in samples if s["gpu"] == device["gpu"]]
            out.append({
                **device,
                "samples": len(mine),
                "utilization_mean_pct": _mean(mine, "utilization_pct"),
                "utilization_max_pct": _max(mine, "utilization_pct"),
                "memory_used_max_mb": _max(mine, "memory_used_mb"),
                "pcie_rx_mean_mbps": _mean(mine, "pcie_rx_mbps"),
                "pcie_tx_mean_mbps": _mean(mine, "pcie_tx_mbps"),
            })
        return out

    def to_dict(self) -> dict:
        with self._lock:
            samples = list(self.samples)
        return {"available": self.available, "reason": self.reason, "interval_s": self.interval,
                "devices": self.devices, "summary": self.summary(), "samples": samples}


def tensorflow_gpus() -> int:
    """How many GPUs TensorFlow trains on here."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _values(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _mean(rows: list[dict], key: str) -> float | None:
    values = _values(rows, key)
    return round(statistics.fmean(values), 2) if values else None


def _max(rows: list[dict], key: str) -> float | None:
    values = _values(rows, key)
    return max(values) if values else None
