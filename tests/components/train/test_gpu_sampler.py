import json
import logging
import sys
import threading
import time

import pytest

from components.common.nvml import nvml_session
from components.common.plots import gpu_use as plot
from components.train.gpu_sampler import GpuSampler
from tests.components import fake_nvml
from tests.waiting import wait_for


def _sampler_threads():
    return [t for t in threading.enumerate() if t.name == "gpu-sampler"]


def test_without_a_gpu_the_sampler_says_so_and_records_nothing(caplog):
    # This machine has no NVIDIA driver: the real nvidia-ml-py fails to load NVML.
    with caplog.at_level(logging.INFO, logger="components.train.gpu_sampler"):
        with GpuSampler(interval=0.01) as gpus:
            time.sleep(0.05)
    assert not gpus.available
    assert gpus.samples == []
    assert "NVML" in gpus.reason
    # Nothing to watch on a machine without a GPU, which preflight's GPU check has already said: not a warning.
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"GPU sampler: {gpus.reason}; recording nothing")]
    assert not _sampler_threads()
    result = json.loads(json.dumps(gpus.to_dict()))
    assert result["available"] is False and result["samples"] == [] and result["summary"] == []


def test_samples_every_device_until_stopped(monkeypatch):
    nvml = fake_nvml.two_gpus()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with GpuSampler(interval=0.01) as gpus:
        wait_for(lambda: len(gpus.samples) >= 8, "8 samples", 10, every=0.01)
    assert not _sampler_threads()
    count = len(gpus.samples)
    time.sleep(0.05)
    assert len(gpus.samples) == count, "sampling must stop with the context"
    assert nvml.state["inits"] == nvml.state["shutdowns"] == 1

    assert gpus.available and gpus.reason is None
    assert [d["name"] for d in gpus.devices] == ["NVIDIA A100-SXM4-40GB", "Tesla T4"]
    a100 = [s for s in gpus.samples if s["gpu"] == 0]
    t4 = [s for s in gpus.samples if s["gpu"] == 1]
    assert len(a100) == len(t4) >= 4
    assert [s["t"] for s in a100] == sorted(s["t"] for s in a100)
    assert all(90 <= s["utilization_pct"] <= 99 for s in a100)
    assert a100[0]["memory_used_mb"] == 12 * 1024 and a100[0]["memory_total_mb"] == 40 * 1024
    assert a100[0]["pcie_rx_mbps"] == 2500.0 and a100[0]["pcie_tx_mbps"] == 125.0
    # The T4 reports no PCIe counters: None, not zero, and not a crash.
    assert all(s["pcie_rx_mbps"] is None and s["pcie_tx_mbps"] is None for s in t4)
    assert all(s["utilization_pct"] == 30 for s in t4)

    summary = {d["gpu"]: d for d in gpus.summary()}
    assert summary[1]["utilization_mean_pct"] == 30 and summary[1]["pcie_rx_mean_mbps"] is None
    assert 90 <= summary[0]["utilization_mean_pct"] <= summary[0]["utilization_max_pct"] <= 99
    assert summary[0]["samples"] == len(a100)
    json.dumps(gpus.to_dict())


def test_plot_draws_the_samples(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.two_gpus())
    with GpuSampler(interval=0.01) as gpus:
        wait_for(lambda: len(gpus.samples) >= 6, "6 samples", 10, every=0.01)
    target = tmp_path / "gpu.png"
    assert plot(gpus.to_dict(), str(target))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plot({"available": False, "samples": [], "devices": []}, str(tmp_path / "none.png"))
    assert not (tmp_path / "none.png").exists()


def test_no_devices_is_said_plainly(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.make([]))
    with GpuSampler(interval=0.01) as gpus:
        pass
    assert not gpus.available and gpus.samples == [] and gpus.reason == "NVML sees no GPU"


def test_sample_cap_bounds_memory(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.two_gpus())
    with GpuSampler(interval=0.001, max_samples=6) as gpus:
        wait_for(lambda: len(gpus.samples) >= 6, "6 samples", 10, every=0.01)
        time.sleep(0.02)
    assert len(gpus.samples) == 6


@pytest.mark.parametrize("missing", [True, False])
def test_nvml_session_reports_why(monkeypatch, missing):
    if missing:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    with nvml_session() as (nvml, reason):
        assert nvml is None
        assert ("not installed" in reason) if missing else ("NVML unavailable" in reason)


def test_a_gpu_tensorflow_trains_on_that_nvml_cannot_watch_is_a_warning(caplog, monkeypatch):
    from components.train import gpu_sampler

    monkeypatch.setattr(gpu_sampler, "tensorflow_gpus", lambda: 1)
    with caplog.at_level(logging.INFO, logger="components.train.gpu_sampler"):
        with GpuSampler(interval=0.01) as gpus:
            pass
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"GPU sampler: {gpus.reason}; recording nothing")]
