"""What a run measures of itself: was the accelerator waiting for input, and how busy were the GPUs.

- The step timer times real training steps; after training, the input probe measures the input
  pipeline's rate alone against the model's step rate on one in-memory batch, and how long the
  real steps waited.
- The profiler's verdict: what TensorBoard's Profile tab says about the traced steps, read without
  TensorBoard, an independent check of the probe (its share is measured inside the traced steps).
- The GPU sampler: utilization, memory and PCIe traffic every few seconds, from a background thread.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import statistics
import sys
import threading
import time

import tensorflow as tf
import tf_keras as keras
from xprof.convert import raw_to_tool_data

from components.common.files import filesystem, uri_of
from components.common.nvml import nvml_session, query
from components.contracts.config import TrainConfig
from components.contracts.layout import Shard
from components.contracts.results import ProfilerVerdict
from components.train.data import PipelineOptions, make_dataset, stored_images

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the step timer and the input probe

def input_probe(model, strategy, shards: list[Shard], train: TrainConfig, global_batch: int, workers: int,
                *, real_step_seconds: float | None, steps: int) -> dict:
    """Input rate alone vs. the model's rate on one in-memory batch, and the time steps waited.

    Runs after the candidate is exported: the synthetic steps still update the weights."""
    worker_batch = global_batch // workers
    iterator = iter(make_dataset(shards, train, PipelineOptions(batch_size=worker_batch, training=True)))
    batch = next(iterator)  # warm-up: fills the shuffle buffer and starts autotuning
    start = time.perf_counter()
    for _ in range(train.input_probe_steps):
        next(iterator)
    input_rate = train.input_probe_steps * worker_batch / (time.perf_counter() - start)

    def synthetic(context: tf.distribute.InputContext):
        per_replica = context.get_per_replica_batch_size(global_batch)
        return tf.data.Dataset.from_tensors((batch[0][:per_replica], batch[1][:per_replica])).repeat()

    # The compiled train step of the fit above, driven by hand: a second fit() would trip over the
    # state BackupAndRestore leaves behind, and this measures the step alone.
    train_step = model.make_train_function()
    batches = iter(strategy.distribute_datasets_from_function(synthetic))
    _sync(train_step(batches))  # warm-up: may trace once more for the new input signature
    calls = max(train.input_probe_steps // train.steps_per_execution, 1)
    start = time.perf_counter()
    for _ in range(calls):
        logs = train_step(batches)
    _sync(logs)
    synthetic_step = (time.perf_counter() - start) / (calls * train.steps_per_execution)
    model_rate = global_batch / synthetic_step / workers if synthetic_step else None
    waited = (max(real_step_seconds - synthetic_step, 0.0) * steps
              if real_step_seconds and synthetic_step else None)
    return {
        "input_images_per_sec": input_rate,
        "model_images_per_sec_synthetic": model_rate,
        "real_step_seconds": real_step_seconds,
        "synthetic_step_seconds": synthetic_step,
        "real_vs_synthetic": synthetic_step / real_step_seconds if real_step_seconds and synthetic_step else None,
        "input_wait_seconds": waited,
        "input_bound": bool(model_rate and input_rate < model_rate),
        "compression": shards[0].compression.lower() or "none",
        "cache": train.image_cache,
        **stored_images(shards, train.image_size),
    }


class StepTimer(keras.callbacks.Callback):
    """Wall time between consecutive batch ends within an epoch: leaves out tracing/compilation of
    the first step, evaluation between epochs, and the profiled steps (tracing slows them)."""

    def __init__(self, skip: tuple[int, int] | int = 0):
        super().__init__()
        self.seconds = 0.0
        self.steps = 0
        self._last = None
        self._skip = range(skip[0] - 1, skip[1] + 1) if skip else range(0)  # Keras counts steps from 1

    def on_epoch_begin(self, epoch, logs=None):
        self._last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self._last is not None and batch not in self._skip:
            self.seconds += now - self._last[0]
            self.steps += batch - self._last[1]
        self._last = (now, batch)

    def step_seconds(self) -> float | None:
        return self.seconds / self.steps if self.steps else None

    def images_per_sec(self, global_batch: int) -> float | None:
        return global_batch / self.step_seconds() if self.steps else None


def _sync(logs) -> None:
    """Waits for a step's results: device work runs asynchronously until a value is read."""
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)


# ---------------------------------------------------------------- the profiler's verdict
# What TensorBoard's Profile tab says about the traced steps, read without TensorBoard.
#
# The trainer traces a few steps (`train.trace_steps`) into `tensorboard/plugins/profile/<session>/
# <host>.xplane.pb`. The profile plugin (xprof) turns that XSpace into the input-pipeline analyzer's
# page with its own converter, the one TensorBoard calls: a table of step times split into input,
# compute and the rest, and a conclusion such as "Your program is HIGHLY input-bound because 62.1%
# of the total step time sampled is waiting for input". That share is measured inside the traced
# steps, so it is an independent check of Stoke's probe, which times the input pipeline and the
# model apart after training.

PROFILER_TOOL = "input_pipeline_analyzer"
# xprof's classes: HIGHLY (>= 20% of step time waiting for input), MODERATELY, COULD, POTENTIALLY, NOT.
CONCLUSION = re.compile(r"Your program (?:is |COULD be )?(\w+)")


def input_pipeline_verdict(tensorboard_dir: str) -> ProfilerVerdict | None:
    """The analyzer's summary of the newest trace under `tensorboard_dir`; None without one.

    A trace the plugin cannot read costs the run nothing but this summary: the reason goes to stderr."""
    fs, path = filesystem(tensorboard_dir)
    traces = sorted(uri_of(fs, t) for t in fs.glob(f"{path}/plugins/profile/*/*.xplane.pb"))
    if not traces:
        return None
    session = traces[-1].rsplit("/", 1)[0]
    hosts = [t for t in traces if t.startswith(session + "/")]
    try:
        data, _ = raw_to_tool_data.xspace_to_tool_data(hosts, PROFILER_TOOL, {})
        return parse_analysis(data, session)
    except Exception as error:  # the plugin's converter raises whatever its C++ side reports
        print(f"stoke train: the profile plugin could not read {session}: {error}", file=sys.stderr, flush=True)
        return None


def parse_analysis(data: bytes | str | None, session: str) -> ProfilerVerdict | None:
    """The summary table of the analyzer's JSON (the page's DataTables, the step table second)."""
    if not data:
        return None
    tables = json.loads(data)
    steps = next((t for t in tables if any(c.get("id") == "stepTimeMs" for c in t.get("cols", []))), None)
    if steps is None:
        return None
    summary, columns = steps.get("p", {}), [c.get("id") for c in steps["cols"]]
    rows = [[cell.get("v") for cell in row["c"]] for row in steps.get("rows", [])]
    # The share the analyzer's conclusion states when it is about input: input time over step time, summed.
    step_time = sum(row[columns.index("stepTimeMs")] for row in rows)
    input_time = sum(row[columns.index("infeedTimeMs")] for row in rows)
    conclusion = summary.get("input_conclusion", "")
    verdict = CONCLUSION.match(conclusion)
    return ProfilerVerdict(
        input_percent=round(100 * input_time / step_time, 2) if step_time else None,
        classification=verdict.group(1).lower() if verdict else "unknown",
        input_bound=bool(verdict) and verdict.group(1) == "HIGHLY",
        step_time_ms=_float(summary.get("steptime_ms_average")),
        input_time_ms=_float(summary.get("infeed_time_ms_avg")),
        steps=len(rows),
        conclusion=conclusion,
        trace=session,
    )


def _float(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- the GPU sampler
# Watches the GPUs while a model trains: utilization, memory and PCIe traffic every few seconds.
#
# A GPU at 30% utilization with a busy PCIe link is waiting for input; one at 95% is the bottleneck
# you paid for. The sampler is a background thread over NVML (nvidia-ml-py), so it costs the
# training loop nothing. Samples are plain dicts, ready for metrics.json and a plot:
#
#     with GpuSampler(interval=5) as gpus:
#         model.fit(...)
#     metrics["gpu"] = gpus.to_dict()
#
# Without a GPU or an NVIDIA driver the sampler records nothing and keeps the reason (metrics.json). It
# says so as a warning only when TensorFlow trains on a GPU that NVML cannot watch: on a machine without
# one there is nothing to watch, and preflight's GPU check has said what the machine has.

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
    return len(tf.config.list_physical_devices("GPU"))


def _values(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _mean(rows: list[dict], key: str) -> float | None:
    values = _values(rows, key)
    return round(statistics.fmean(values), 2) if values else None


def _max(rows: list[dict], key: str) -> float | None:
    values = _values(rows, key)
    return max(values) if values else None
