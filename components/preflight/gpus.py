"""GPUs as the driver (NVML) and TensorFlow see them: the preflight checks."""
from __future__ import annotations

from components.common.nvml import nvml_session, query
from components.preflight.checks import Check


def gpu_check(require_gpu: bool = False) -> Check:
    """GPUs as the driver sees them (NVML): name, memory, driver, PCIe link."""
    missing = "fail" if require_gpu else "warn"
    fix = "install the NVIDIA driver; in Docker add --gpus all (NVIDIA Container Toolkit)"
    with nvml_session() as (nvml, reason):
        if nvml is None:
            return Check("GPU", missing, f"no GPU: {reason}", fix, {"count": 0})
        driver = query(nvml, "nvmlSystemGetDriverVersion")
        cuda = query(nvml, "nvmlSystemGetCudaDriverVersion")
        devices, narrow = [], []
        for index in range(query(nvml, "nvmlDeviceGetCount") or 0):
            handle = query(nvml, "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            memory = query(nvml, "nvmlDeviceGetMemoryInfo", handle)
            device = {
                "gpu": index,
                "name": query(nvml, "nvmlDeviceGetName", handle),
                "memory_gb": None if memory is None else round(memory.total / 2**30, 1),
                "pcie_gen": query(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
                "pcie_gen_max": query(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
                "pcie_width": query(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
                "pcie_width_max": query(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
            }
            # The link generation drops at idle to save power; a narrower link does not recover.
            if device["pcie_width"] and device["pcie_width_max"] and device["pcie_width"] < device["pcie_width_max"]:
                narrow.append(f"GPU {index} runs at x{device['pcie_width']} of x{device['pcie_width_max']}")
            devices.append(device)
    facts = {"count": len(devices), "driver": driver,
             "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None, "devices": devices}
    if not devices:
        return Check("GPU", missing, "no GPU: NVML sees none", fix, facts)
    names = ", ".join(f"{d['name']} {d['memory_gb']} GB PCIe {d['pcie_gen']}.0 x{d['pcie_width']}"
                      for d in devices)
    summary = f"{len(devices)} GPU(s): {names}; driver {driver}, CUDA {facts['cuda_driver']}"
    if narrow:
        return Check("GPU", "warn", summary + "; " + "; ".join(narrow),
                     "reseat the card in a full-width slot, or check the riser", facts)
    return Check("GPU", "ok", summary, facts=facts)


def tensorflow_check(require_gpu: bool = False, driver_gpus: int = 0) -> Check:
    """The GPUs TensorFlow itself can use, and the CUDA/cuDNN it was built against."""
    try:
        import tensorflow as tf
    except ImportError as e:
        return Check("TensorFlow GPUs", "fail", f"TensorFlow does not import: {e}")
    build = tf.sysconfig.get_build_info()
    gpus = tf.config.list_physical_devices("GPU")
    facts = {"version": tf.__version__, "gpus": len(gpus), "cuda_build": bool(build.get("is_cuda_build")),
             "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version")}
    built = (f"TensorFlow {tf.__version__} built with CUDA {facts['cuda']}, cuDNN {facts['cudnn']}"
             if facts["cuda_build"] else f"TensorFlow {tf.__version__} built without CUDA")
    if driver_gpus > len(gpus):
        fix = ("pip install 'tensorflow[and-cuda]'" if not facts["cuda_build"] else
               "check CUDA_VISIBLE_DEVICES and that the CUDA/cuDNN libraries TensorFlow wants are found")
        return Check("TensorFlow GPUs", "fail" if require_gpu else "warn",
                     f"{built} sees {len(gpus)} of the {driver_gpus} GPU(s) the driver reports", fix, facts)
    if not gpus:
        return Check("TensorFlow GPUs", "fail" if require_gpu else "ok",
                     f"{built} sees no GPU; training runs on the CPU", facts=facts)
    return Check("TensorFlow GPUs", "ok", f"{built} sees {len(gpus)} GPU(s)", facts=facts)
