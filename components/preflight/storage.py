"""The disks under ROOT: SMART health of every physical disk behind it, sequential read speed past
the page cache against what training needs, and free space for the next span."""
from __future__ import annotations

import math
import mmap
import os
import shutil
import tempfile
import time
import uuid
from collections import defaultdict

from components.common.files import filesystem, is_local, join, protocol, read_json, uri_of
from components.common.program import setting_hint
from components.common.spans import Spans
from components.common.store_errors import problem
from components.contracts.layout import METRICS, Root
from components.contracts.results import SpanManifest
from components.preflight import disks
from components.preflight.checks import Check

MB = 1_000_000
CHUNK = 4 * 2**20  # a multiple of every block size, as O_DIRECT requires
MIN_TIMED_BYTES = 16 * 2**20  # below this a timing is mostly open() and seek latency


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


def read_throughput(root: str, manifests: list[SpanManifest], sample_mb: int = 256,
                    min_read_mbps: float | None = None) -> Check:
    """Sequential MB/s reading the newest span's shards (else a temporary file), past the page cache."""
    budget = sample_mb * 2**20
    local = local_path(root)
    shards = _newest_shards(root, manifests)
    try:
        if shards and sum(size for _, size in shards) >= min(budget, MIN_TIMED_BYTES):
            what = f"span {manifests[-1].span} shards"
            nbytes, seconds, method = (_read_local([local_path(u) for u, _ in shards], budget) if local
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


def _newest_shards(root: str, manifests: list[SpanManifest]) -> list[tuple[str, int]]:
    if not manifests:
        return []
    folder = Root(root).span(manifests[-1].span)
    return [(join(folder, s.file), s.bytes) for s in manifests[-1].shards]


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
    return total, time.perf_counter() - start, f"{protocol(fs)} over the network"


def _read_temporary(folder: str, budget: int) -> tuple[int, float, str]:
    # One random block repeated: incompressible per block, so compressing filesystems cannot cheat,
    # and cheaper to make than `budget` fresh random bytes.
    block = os.urandom(CHUNK)
    handle, path = tempfile.mkstemp(prefix=".stoke-preflight-", dir=folder)
    try:
        with os.fdopen(handle, "wb") as f:
            for _ in range(max(1, budget // CHUNK)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())  # clean pages can be dropped; dirty ones cannot
        return _read_local([path], budget)
    finally:
        os.unlink(path)


def _training_need(root: str, manifests: list[SpanManifest]) -> dict:
    """images/s of the last run x bytes per image of the newest span, when both are known."""
    if not manifests:
        return {}
    shards = manifests[-1].shards
    records = sum(s.records for s in shards)
    if not records:
        return {}
    bytes_per_image = sum(s.bytes for s in shards) / records
    found = {"bytes_per_image": round(bytes_per_image, 1)}
    try:
        fs, runs = filesystem(Root(root).runs)
        metrics = fs.glob(join(runs, "*", METRICS))
        if metrics:
            newest = max(metrics, key=lambda p: (fs.info(p).get("mtime") or 0, p))
            images_per_sec = read_json(uri_of(fs, newest)).get("images_per_sec")
            if images_per_sec:
                found.update(images_per_sec=images_per_sec,
                             need_mbps=round(images_per_sec * bytes_per_image / MB, 2))
    except (OSError, ValueError):
        pass  # a run without readable metrics says nothing about the need
    return found


def free_space(root: str, manifests: list[SpanManifest]) -> Check:
    """Free bytes under ROOT against the size of the next span (guessed as the last one's)."""
    local = local_path(root)
    if not local:
        return Check("free space", "skip", f"{root} is an object store: no free space to run out of")
    usage = shutil.disk_usage(_existing(local))
    next_span = sum(s.bytes for s in manifests[-1].shards) if manifests else 0
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


def shard_cache(root: str, manifests: list[SpanManifest], cache_dir: str | None, max_gb: float) -> Check:
    """With ROOT on a store TensorFlow cannot read, the shard cache's disk against what training
    must copy into it: every published shard not cached yet, plus the next span. A folder the cache
    would refuse (a link, another user's, writable by others) fails here with the same line."""
    from components.common.cache_folder import refusal
    from components.common.shard_cache import ShardCache
    from components.common.tf_files import tf_reads

    if tf_reads(root):
        return Check("shard cache", "skip", f"TensorFlow reads {root} itself: no local copies")
    cache = ShardCache(cache_dir, max_gb)
    refused = refusal(cache.folder)
    if refused:
        return Check("shard cache", "fail", *refused, {"folder": cache.folder})
    shards = Spans(root).shards("train", checked=False) + Spans(root).shards("eval", checked=False)
    need = cache.needs(shards) + (sum(s.bytes for s in manifests[-1].shards) if manifests else 0)
    usage = shutil.disk_usage(_existing(cache.folder))
    facts = {"folder": cache.folder, "free_bytes": usage.free, "need_bytes": need, "max_bytes": cache.max_bytes}
    summary = (f"{cache.folder}: {usage.free / 1e9:,.1f} GB free; training copies about {_size(need)} of shards "
               f"into it (cap {cache.max_bytes / 1e9:g} GB)")
    if usage.free < need:
        return Check("shard cache", "fail", summary, "free space there, or move the cache to a larger disk, "
                     + setting_hint(None, {"shard_cache.dir": "PATH"}), facts)
    if sum(s.bytes or 0 for s in shards) > cache.max_bytes:
        raise_to = math.ceil(sum(s.bytes or 0 for s in shards) / 1e9)
        return Check("shard cache", "fail", summary + "; the shards exceed the cap",
                     "raise it, e.g. " + setting_hint(None, {"shard_cache.max_gb": raise_to}), facts)
    return Check("shard cache", "ok", summary, facts=facts)


def writable(root: str) -> Check:
    """ROOT takes a small file and gives it back: training, gate and push all write under it.
    A local ROOT that does not exist yet is tried at its nearest existing folder, where the stages
    would create it."""
    local = local_path(root)
    folder = _existing(local) if local else root
    fs, path = filesystem(folder)
    probe = join(path, f".stoke-preflight-{uuid.uuid4().hex[:12]}")
    try:
        fs.pipe_file(probe, b"stoke preflight\n")
        fs.rm(probe)
    except Exception as e:
        store = problem(e, root)  # no credentials, refused ones, no such bucket: which, and what to set
        if store is not None:
            return Check("ROOT writable", "fail", f"cannot write under {folder}: {store.summary}", store.fix,
                         {"path": folder, "transient": store.transient})
        if not isinstance(e, OSError):
            raise
        return Check("ROOT writable", "fail", f"cannot write under {folder}: {e.strerror or e}",
                     "make ROOT writable (mount it read-write, fix its owner or the bucket's permissions)",
                     {"path": folder})
    return Check("ROOT writable", "ok", f"{folder} takes a new file", facts={"path": folder})


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.1f} MB"


def local_path(uri: str) -> str | None:
    fs, path = filesystem(uri)
    return os.path.abspath(path) if is_local(fs) else None


def _existing(path: str) -> str:
    """The path, or its nearest existing parent (ROOT may not exist before the first ingest)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path
