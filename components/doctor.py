"""Preflight: know the machine before blaming the model.

A worn NVMe drive quietly halves data loading, a container with a 64 MB /dev/shm hangs the
loaders, a GPU on a x4 link idles at 30%. `run_checks` looks at each of these before any GPU hour
is spent and returns a Report: one Check per fact, each ok, warn, fail or skip, with the reason and
the flag that fixes it. Nothing here raises on an odd machine; what cannot be measured is a warning
that says why.
"""
from __future__ import annotations

import mmap
import os
import resource
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from components import disks
from components.gpu_sampler import nvml_session, query
from components.layout import Root, filesystem, join, read_json

MB = 1_000_000
CHUNK = 4 * 2**20  # a multiple of every block size, as O_DIRECT requires
MIN_TIMED_BYTES = 16 * 2**20  # below this a timing is mostly open() and seek latency
DOCKER_SHM_DEFAULT = 64 * 2**20
SHM_WARN = 2**30
CORES_PER_GPU = 4  # parallel JPEG/PNG decode to keep one GPU fed
MIN_OPEN_FILES = 4096
SEVERITY = {"ok": 0, "skip": 0, "warn": 1, "fail": 2}


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    summary: str
    fix: str | None = None
    facts: dict = field(default_factory=dict)


@dataclass
class Report:
    checks: list[Check]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    @property
    def status(self) -> str:
        return max((c.status for c in self.checks), key=SEVERITY.__getitem__, default="ok")

    def failure_line(self) -> str | None:
        """One line naming the first failed check and why, for a terminal or a flow's log."""
        if not self.failed:
            return None
        first, more = self.failed[0], len(self.failed) - 1
        return f"{first.name} failed: {first.summary}" + (f" (and {more} more)" if more else "")

    def to_dict(self) -> dict:
        return {"status": self.status, "failed": [c.name for c in self.failed],
                "checks": [asdict(c) for c in self.checks]}


def run_checks(root: str, source: str | None = None, require_gpu: bool = False,
               min_read_mbps: float | None = None, *, sample_mb: int = 256,
               mounts_text: str | None = None, sys_root: str = "/sys",
               smartctl: str = "smartctl") -> Report:
    """Every preflight check for training from ROOT (and ingesting from SOURCE when local)."""
    local_root = _local_path(root)
    paths = {"ROOT": local_root} if local_root else {}
    if source and _local_path(source):
        paths["source"] = _local_path(source)
    manifests = _manifests(root)
    checks = _guarded("disk health", disk_health, paths, mounts_text, sys_root, smartctl) if paths else [
        Check("disk health", "skip", f"ROOT {root} is not a local path; its store keeps its own disks")]
    checks.append(_guarded("read throughput", read_throughput, root, manifests, sample_mb, min_read_mbps))
    checks.append(_guarded("free space", free_space, root, manifests))
    gpu = _guarded("GPU", gpu_check, require_gpu)
    gpus = gpu.facts.get("count", 0)
    checks += [gpu, _guarded("TensorFlow GPUs", tensorflow_check, require_gpu, gpus),
               _guarded("CPU cores", cpu_check, gpus), _guarded("/dev/shm", shm_check, gpus),
               _guarded("memlock", memlock_check), _guarded("open files", open_files_check)]
    return Report(checks)


def _guarded(name: str, check, *args):
    """Runs one check; a surprise on an odd machine becomes a warning naming it, not a crash."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 - a preflight must report, never stop the report
        found = Check(name, "warn", f"could not check: {type(e).__name__}: {e}")
        return [found] if name == "disk health" else found


# --- disks ---------------------------------------------------------------------------------------


def disk_health(paths: dict[str, str], mounts_text: str | None = None, sys_root: str = "/sys",
                smartctl: str = "smartctl") -> list[Check]:
    """SMART health of every physical disk behind the given paths, one Check per disk."""
    if mounts_text is None:
        try:
            with open("/proc/mounts", encoding="utf-8") as f:
                mounts_text = f.read()
        except OSError:
            return [Check("disk health", "warn", "no /proc/mounts: cannot map paths to disks on this OS")]
    mounts = disks.parse_mounts(mounts_text)
    owners: dict[str, list[str]] = defaultdict(list)
    checks = []
    for label, path in paths.items():
        mount = disks.mount_for(path, mounts)
        found = disks.disks_behind(mount.device, sys_root) if mount else []
        if mount and not found:
            # /dev/root and friends name no device; the path's st_dev still does.
            name = disks.device_of_path(_existing(path), sys_root)
            found = disks.disks_behind(f"/dev/{name}", sys_root) if name else []
        if not found:
            where = f"{mount.device} ({mount.fstype}) at {mount.mountpoint}" if mount else "no mount"
            checks.append(Check("disk health", "warn", f"{label} {path} is on {where}: no local "
                                "block device behind it, so no SMART to read", facts={"path": path}))
        for disk in found:
            owners[disk].append(label)
    for disk, labels in owners.items():
        reason = disks.virtual_reason(disk, sys_root)
        device = f"/dev/{disk}"
        health = (disks.Health(device, "unavailable", [reason]) if reason
                  else disks.smart_health(device, smartctl))
        checks.append(_health_check(health, labels))
    return checks


def _health_check(health: disks.Health, labels: list[str]) -> Check:
    who = f"{health.device} ({', '.join(labels)})"
    facts = health.to_dict()
    if health.status == "unavailable":
        fix = "apt-get install smartmontools" if "smartctl not found" in health.reasons[0] else None
        return Check("disk health", "warn", f"{who}: SMART not available: {health.reasons[0]}", fix, facts)
    if health.status == "ok":
        shown = [f"{k}={facts[k]}" for k in ("model", "percentage_used", "available_spare",
                                             "temperature_c", "power_on_hours") if facts.get(k) is not None]
        return Check("disk health", "ok", f"{who}: healthy " + " ".join(shown), None, facts)
    fix = ("copy the spans off this disk and replace it, or move ROOT to a healthy one"
           if health.status == "fail" else "watch this disk; run `smartctl -t long` and back up ROOT")
    return Check("disk health", health.status, f"{who}: " + "; ".join(health.reasons), fix, facts)


# --- read throughput and space -------------------------------------------------------------------


def read_throughput(root: str, manifests: list[dict], sample_mb: int = 256,
                    min_read_mbps: float | None = None) -> Check:
    """Sequential MB/s reading the newest span's shards (else a temporary file), past the page cache."""
    budget = sample_mb * 2**20
    local = _local_path(root)
    shards = _newest_shards(root, manifests)
    try:
        if shards and sum(size for _, size in shards) >= min(budget, MIN_TIMED_BYTES):
            what = f"span {manifests[-1]['span']} shards"
            nbytes, seconds, method = (_read_local([_local_path(u) for u, _ in shards], budget) if local
                                       else _read_remote([u for u, _ in shards], budget))
        elif local:
            what = "a temporary file"
            nbytes, seconds, method = _read_temporary(_existing(local), budget)
        else:
            return Check("read throughput", "skip", "no published span large enough to time under "
                         f"{root}; writing test files to a bucket is not worth it")
    except OSError as e:
        return Check("read throughput", "warn", f"could not read under {root}: {e}")
    mbps = nbytes / MB / max(seconds, 1e-9)
    facts = {"mbps": round(mbps, 1), "bytes": nbytes, "seconds": round(seconds, 4), "method": method,
             "read": what, **_training_need(root, manifests)}
    summary = f"{mbps:,.0f} MB/s reading {nbytes / MB:,.0f} MB of {what} ({method})"
    need = facts.get("need_mbps")
    if need:
        summary += f"; training needs {need:,.1f} MB/s ({facts['images_per_sec']:,.0f} images/s)"
    if min_read_mbps and mbps < min_read_mbps:
        return Check("read throughput", "fail", f"{summary}, below the required {min_read_mbps:,.0f} MB/s",
                     "move ROOT to a faster disk, or check the disk's health", facts)
    if need and mbps < need:
        return Check("read throughput", "warn", f"{summary}: the disk will bound training",
                     "cache the spans on local NVMe, or use fewer, larger shards", facts)
    return Check("read throughput", "ok", summary, None, facts)


def _newest_shards(root: str, manifests: list[dict]) -> list[tuple[str, int]]:
    if not manifests:
        return []
    folder = Root(root).span(manifests[-1]["span"])
    return [(join(folder, s["file"]), int(s.get("bytes", 0))) for s in manifests[-1]["shards"]]


def _open_uncached(path: str) -> tuple[int, str]:
    """Opens a file so reads come from the disk: O_DIRECT, else dropping its cached pages."""
    if hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT), "O_DIRECT"
        except OSError:
            pass  # tmpfs and some FUSE filesystems refuse O_DIRECT
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd, "fadvise DONTNEED"
    return fd, "page cache (not bypassed: figures may be optimistic)"


def _read_local(paths: list[str], budget: int) -> tuple[int, float, str]:
    buffer = mmap.mmap(-1, CHUNK)  # page-aligned memory, as O_DIRECT requires
    total, methods = 0, set()
    start = time.perf_counter()
    for path in paths:
        fd, method = _open_uncached(path)
        try:
            offset = 0
            while total < budget:
                try:
                    n = os.preadv(fd, [buffer], offset)
                except OSError:
                    if method != "O_DIRECT":
                        raise
                    # O_DIRECT opened but the filesystem refuses direct reads: fall back.
                    os.close(fd)
                    fd, method = os.open(path, os.O_RDONLY), "fadvise DONTNEED"
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    continue
                total += n
                offset += n
                if n < CHUNK:
                    break
        finally:
            os.close(fd)
        methods.add(method)
        if total >= budget:
            break
    return total, time.perf_counter() - start, ", ".join(sorted(methods))


def _read_remote(uris: list[str], budget: int) -> tuple[int, float, str]:
    total = 0
    start = time.perf_counter()
    for uri in uris:
        fs, path = filesystem(uri)
        with fs.open(path, "rb", block_size=CHUNK) as f:
            while total < budget and (chunk := f.read(CHUNK)):
                total += len(chunk)
        if total >= budget:
            break
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
    return total, time.perf_counter() - start, f"{protocol} over the network"


def _read_temporary(folder: str, budget: int) -> tuple[int, float, str]:
    # One random block repeated: incompressible per block, so compressing filesystems cannot cheat,
    # and cheaper to make than `budget` fresh random bytes.
    block = os.urandom(CHUNK)
    handle, path = tempfile.mkstemp(prefix=".stoke-doctor-", dir=folder)
    try:
        with os.fdopen(handle, "wb") as f:
            for _ in range(max(1, budget // CHUNK)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())  # clean pages can be dropped; dirty ones cannot
        return _read_local([path], budget)
    finally:
        os.unlink(path)


def _training_need(root: str, manifests: list[dict]) -> dict:
    """images/s of the last run x bytes per image of the newest span, when both are known."""
    if not manifests:
        return {}
    shards = manifests[-1]["shards"]
    records = sum(s.get("records", 0) for s in shards)
    if not records:
        return {}
    bytes_per_image = sum(s.get("bytes", 0) for s in shards) / records
    found = {"bytes_per_image": round(bytes_per_image, 1)}
    try:
        fs, runs = filesystem(join(root, "runs"))
        metrics = fs.glob(join(runs, "*", "metrics.json"))
        if metrics:
            newest = max(metrics, key=lambda p: (fs.info(p).get("mtime") or 0, p))
            images_per_sec = read_json(fs.unstrip_protocol(newest)).get("images_per_sec")
            if images_per_sec:
                found.update(images_per_sec=images_per_sec,
                             need_mbps=round(images_per_sec * bytes_per_image / MB, 2))
    except (OSError, ValueError):
        pass  # a run without readable metrics says nothing about the need
    return found


def free_space(root: str, manifests: list[dict]) -> Check:
    """Free bytes under ROOT against the size of the next span (guessed as the last one's)."""
    local = _local_path(root)
    if not local:
        return Check("free space", "skip", f"{root} is an object store: no free space to run out of")
    usage = shutil.disk_usage(_existing(local))
    next_span = sum(int(s.get("bytes", 0)) for s in manifests[-1]["shards"]) if manifests else 0
    facts = {"free_bytes": usage.free, "total_bytes": usage.total, "next_span_bytes": next_span}
    summary = f"{usage.free / 1e9:,.1f} GB free of {usage.total / 1e9:,.1f} GB"
    if not next_span:
        return Check("free space", "ok", summary + "; no published span yet to size the next one",
                     facts=facts)
    summary += f"; the next span needs about {_size(next_span)}"
    if usage.free < next_span:
        return Check("free space", "fail", summary, "free space under ROOT or point ROOT elsewhere", facts)
    if usage.free < 2 * next_span:
        return Check("free space", "warn", summary + " (less than two spans left)",
                     "free space under ROOT before the next ingest", facts)
    return Check("free space", "ok", summary, facts=facts)


# --- GPUs ----------------------------------------------------------------------------------------


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


# --- processes and limits ------------------------------------------------------------------------


def cpu_check(gpus: int = 0) -> Check:
    """Cores this process may use (affinity and the cgroup's CPU quota) against the decode work."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_cpus()
    usable = min(affinity, quota) if quota else affinity
    want = CORES_PER_GPU * max(1, gpus)
    facts = {"cores": os.cpu_count(), "affinity": affinity, "cgroup_quota": quota, "usable": usable}
    summary = f"{usable:g} usable cores ({os.cpu_count()} online" + (f", quota {quota:g}" if quota else "") + ")"
    if usable < want:
        return Check("CPU cores", "warn", f"{summary}: fewer than {want}, so image decoding may starve "
                     f"{'the GPUs' if gpus else 'training'}", "give the container more cores "
                     "(docker run --cpus N, or drop --cpuset-cpus)", facts)
    return Check("CPU cores", "ok", summary, facts=facts)


def _cgroup_cpus() -> float | None:
    # The container's own limits appear at the root of its cgroup namespace.
    for path, parse in (("/sys/fs/cgroup/cpu.max", _cpu_max),
                        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", _cfs_quota)):
        try:
            with open(path, encoding="utf-8") as f:
                return parse(f.read())
        except (OSError, ValueError):
            continue
    return None


def _cpu_max(text: str) -> float | None:
    quota, period = text.split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _cfs_quota(text: str) -> float | None:
    quota = int(text)
    with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="utf-8") as f:
        period = int(f.read())
    return None if quota < 0 else quota / period


def shm_check(gpus: int = 0, path: str = "/dev/shm") -> Check:
    """Size of /dev/shm: NCCL and multi-process loaders put their buffers there."""
    fix = "docker run --shm-size=8g (or --ipc=host); on Kubernetes mount an emptyDir with medium: Memory"
    try:
        st = os.statvfs(path)
    except OSError:
        return Check("/dev/shm", "warn", f"{path} is missing", fix)
    size = st.f_blocks * st.f_frsize
    facts = {"bytes": size, "free_bytes": st.f_bavail * st.f_frsize}
    summary = f"{size / 2**20:,.0f} MiB"
    if size <= DOCKER_SHM_DEFAULT:
        # Docker's default 64 MB is the size that hangs NCCL and loaders; on a CPU-only box it is
        # only a warning, since nothing in single-process tf.data needs it.
        return Check("/dev/shm", "fail" if gpus else "warn", f"{summary}: Docker's default, too small "
                     "for NCCL and multi-process loaders", fix, facts)
    if size < SHM_WARN:
        return Check("/dev/shm", "warn", f"{summary}: under 1 GiB", fix, facts)
    return Check("/dev/shm", "ok", summary, facts=facts)


def memlock_check() -> Check:
    """`ulimit -l`: CUDA pinned host buffers, NCCL and GPUDirect RDMA lock memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    facts = {"soft": _limit(soft), "hard": _limit(hard)}
    if soft == resource.RLIM_INFINITY:
        return Check("memlock", "ok", "unlimited", facts=facts)
    return Check("memlock", "warn", f"{soft // 1024:,} KiB: pinned-memory transfers and RDMA may fail or "
                 "fall back to pageable copies", "docker run --ulimit memlock=-1 (or `ulimit -l unlimited`)",
                 facts)


def open_files_check() -> Check:
    """`ulimit -n`: every shard in an interleave, socket and checkpoint file needs a descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    facts = {"soft": _limit(soft), "hard": _limit(hard)}
    if soft != resource.RLIM_INFINITY and soft < MIN_OPEN_FILES:
        raise_to = "" if hard == resource.RLIM_INFINITY or hard <= soft else f" (or `ulimit -n {hard}`)"
        return Check("open files", "warn", f"{soft:,}: under {MIN_OPEN_FILES:,}",
                     f"docker run --ulimit nofile=65536:65536{raise_to}", facts)
    return Check("open files", "ok", f"{facts['soft']:,}" if soft != resource.RLIM_INFINITY else "unlimited",
                 facts=facts)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.1f} MB"


def _limit(value: int) -> int | str:
    return "unlimited" if value == resource.RLIM_INFINITY else value


# --- helpers -------------------------------------------------------------------------------------


def _local_path(uri: str) -> str | None:
    fs, path = filesystem(uri)
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return os.path.abspath(path) if {"file", "local"} & set(protocols) else None


def _existing(path: str) -> str:
    """The path, or its nearest existing parent (ROOT may not exist before the first ingest)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _manifests(root: str) -> list[dict]:
    try:
        return Root(root).manifests()
    except (OSError, ValueError):
        return []


def render(report: Report):
    """The report as a rich Table for the terminal."""
    from rich.table import Table

    colour = {"ok": "green", "skip": "dim", "warn": "yellow", "fail": "bold red"}
    table = Table(title="stoke doctor", show_lines=False)
    for column in ("check", "status", "finding", "fix"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.summary, c.fix or "")
    return table
