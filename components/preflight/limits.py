"""Process limits that starve or hang training: usable cores, /dev/shm, memlock and open files,
each with the Docker flag that fixes it."""
from __future__ import annotations

import os
import resource

from components.preflight.checks import Check

DOCKER_SHM_DEFAULT = 64 * 2**20
SHM_WARN = 2**30
CORES_PER_GPU = 4  # parallel JPEG/PNG decode to keep one GPU fed
MIN_OPEN_FILES = 4096


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


def _limit(value: int) -> int | str:
    return "unlimited" if value == resource.RLIM_INFINITY else value
