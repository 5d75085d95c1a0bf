"""A stand-in for the `pynvml` module with the calls Stoke makes, for machines without a GPU.

Each device is a dict; a missing key answers NVMLError_NotSupported, as NVML does for fields a
board does not report. Counters move on every call so a sampler sees changing values.
"""
from __future__ import annotations

import itertools
import types

NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


def make(devices: list[dict], driver="550.54.15", cuda=12040):
    """A module object that `import pynvml` can return (put it in sys.modules)."""
    state = {"inits": 0, "shutdowns": 0, "tick": itertools.count()}

    def field(handle, key):
        if key not in devices[handle]:
            raise NVMLError_NotSupported("Not Supported")
        value = devices[handle][key]
        return value(next(state["tick"])) if callable(value) else value

    def memory(handle):
        return types.SimpleNamespace(total=field(handle, "memory_total"), used=field(handle, "memory_used"),
                                     free=field(handle, "memory_total") - field(handle, "memory_used"))

    def rates(handle):
        return types.SimpleNamespace(gpu=field(handle, "utilization"), memory=field(handle, "memory_util"))

    def throughput(handle, counter):
        return field(handle, "pcie_rx_kbps" if counter == NVML_PCIE_UTIL_RX_BYTES else "pcie_tx_kbps")

    def init():
        state["inits"] += 1

    def shutdown():
        state["shutdowns"] += 1

    def handle_by_index(index):
        if index >= len(devices):
            raise NVMLError("Invalid Argument")
        return index

    return types.SimpleNamespace(
        state=state,
        NVMLError=NVMLError,
        NVML_PCIE_UTIL_TX_BYTES=NVML_PCIE_UTIL_TX_BYTES,
        NVML_PCIE_UTIL_RX_BYTES=NVML_PCIE_UTIL_RX_BYTES,
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlSystemGetDriverVersion=lambda: driver,
        nvmlSystemGetCudaDriverVersion=lambda: cuda,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=handle_by_index,
        nvmlDeviceGetName=lambda h: field(h, "name"),
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetUtilizationRates=rates,
        nvmlDeviceGetPcieThroughput=throughput,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: field(h, "gen"),
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: field(h, "gen_max"),
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: field(h, "width"),
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: field(h, "width_max"),
    )


def two_gpus():
    """An A100 on a full x16 link and an older card whose link trained at x8, without PCIe counters."""
    return make([
        {"name": "NVIDIA A100-SXM4-40GB", "memory_total": 40 * 2**30, "memory_used": 12 * 2**30,
         "utilization": lambda tick: 90 + tick % 10, "memory_util": 40,
         "pcie_rx_kbps": 2_500_000, "pcie_tx_kbps": 125_000,
         "gen": 4, "gen_max": 4, "width": 16, "width_max": 16},
        {"name": "Tesla T4", "memory_total": 15 * 2**30, "memory_used": 2**30,
         "utilization": 30, "memory_util": 5, "gen": 3, "gen_max": 3, "width": 8, "width_max": 16},
    ])
