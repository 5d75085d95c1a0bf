"""Which physical disk holds a path, and is it healthy: mounts -> block devices -> SMART.

A path lives on a mount; the mount's source is a partition, a device-mapper volume (LVM, LUKS) or
a software RAID, each of which sits on one or more whole disks. SMART data belongs to the whole
disk, so we walk sysfs down to it. Health comes from `smartctl --json -a` (smartmontools); when
that cannot answer (no smartctl, a virtual disk, no permission) we say why instead of guessing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from components.common import processes

# Disks that have no SMART to read: virtio, Xen, loop files, compressed RAM, network block devices.
VIRTUAL_PREFIXES = ("vd", "xvd", "loop", "zram", "ram", "nbd", "rbd")
VIRTUAL_MODELS = ("qemu", "vmware", "virtual", "vbox", "msft")

# smartctl's exit status is a bit mask (smartctl(8), RETURN VALUES).
EXIT_BITS = {
    0: "command line did not parse",
    1: "device open failed",
    2: "a SMART or other command to the disk failed, or a SMART data structure has a bad checksum",
    3: "SMART status says DISK FAILING",
    4: "prefail attributes are at or below their threshold",
    5: "some attributes were at or below their threshold in the past",
    6: "the device error log contains errors",
    7: "the self-test log contains errors",
}
UNREADABLE_BITS = (0, 1)
FAILING_BITS = (3, 4)

# Health thresholds. NVMe "percentage used" is wear against the vendor's endurance rating
# (100 = rated life spent; drives keep working past it but leave warranty and wear faster).
WEAR_WARN_PCT = 80
WEAR_FAIL_PCT = 100
TEMP_WARN_C = 70
REALLOCATED_FAIL = 10  # Backblaze's fleet data: failure rates climb steeply once sectors remap.
# ATA attributes whose normalized value is the percentage of life left on an SSD.
LIFE_LEFT_ATTRIBUTES = {177: "Wear_Leveling_Count", 202: "Percent_Lifetime_Remain",
                        231: "SSD_Life_Left", 233: "Media_Wearout_Indicator"}

NVME_CRITICAL_WARNING = {
    0: "available spare below threshold",
    1: "temperature outside its limits",
    2: "reliability degraded by media or internal errors",
    3: "media placed in read-only mode",
    4: "volatile memory backup failed",
    5: "persistent memory region read-only",
}


@dataclass(frozen=True)
class Mount:
    device: str
    mountpoint: str
    fstype: str


def parse_mounts(text: str) -> list[Mount]:
    """Parses /proc/mounts (or /etc/mtab) text; spaces in paths arrive octal-escaped as \\040."""
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            device, mountpoint, fstype = (_unescape(p) for p in parts[:3])
            mounts.append(Mount(device, mountpoint, fstype))
    return mounts


def _unescape(value: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path`: the longest mount point above it, the last one when stacked."""
    path = os.path.realpath(os.path.abspath(path))
    best = None
    for mount in mounts:
        point = mount.mountpoint.rstrip("/") or "/"
        if point == "/" or path == point or path.startswith(point + "/"):
            if best is None or len(point) >= len(best.mountpoint.rstrip("/") or "/"):
                best = mount
    return best


def disks_behind(device: str, sys_root: str = "/sys") -> list[str]:
    """Kernel names of the whole disks under a mount source: nvme0n1p2 -> [nvme0n1];
    /dev/mapper/vg-root -> dm-1 -> dm-0 -> nvme0n1p3 -> [nvme0n1]; md0 -> [sda, sdb]."""
    name = _kernel_name(device, sys_root)
    return sorted(set(_walk(name, sys_root))) if name else []


def _kernel_name(device: str, sys_root: str) -> str | None:
    if device.startswith("/dev/mapper/"):
        wanted = device[len("/dev/mapper/"):]
        block = os.path.join(sys_root, "block")
        for name in sorted(os.listdir(block)) if os.path.isdir(block) else []:
            if _read(os.path.join(block, name, "dm", "name")) == wanted:
                return name
        return None
    if not device.startswith("/dev/"):
        return None  # tmpfs, overlay, proc, a network share: no block device
    if os.path.islink(device):  # /dev/disk/by-uuid/..., /dev/vg/lv
        device = os.path.realpath(device)
    name = os.path.basename(device)
    return name if os.path.exists(os.path.join(sys_root, "class", "block", name)) else None


def _walk(name: str, sys_root: str, depth: int = 0) -> list[str]:
    node = os.path.join(sys_root, "class", "block", name)
    if depth > 8 or not os.path.exists(node):
        return []
    if os.path.exists(os.path.join(node, "partition")):
        # sysfs nests a partition inside its disk: .../block/nvme0n1/nvme0n1p2
        parent = os.path.basename(os.path.dirname(os.path.realpath(node)))
        return _walk(parent, sys_root, depth + 1)
    slaves = os.path.join(node, "slaves")
    below = sorted(os.listdir(slaves)) if os.path.isdir(slaves) else []
    if below:
        return [disk for slave in below for disk in _walk(slave, sys_root, depth + 1)]
    return [name]


def device_of_path(path: str, sys_root: str = "/sys") -> str | None:
    """Kernel name of the block device behind a path from its st_dev, for mounts whose source
    names no device (/dev/root in containers and initramfs boots)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    link = os.path.join(sys_root, "dev", "block", f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    return os.path.basename(os.path.realpath(link)) if os.path.exists(link) else None


def virtual_reason(name: str, sys_root: str = "/sys") -> str | None:
    """Why a disk has no SMART to read, or None when it may have some."""
    if name.startswith(VIRTUAL_PREFIXES):
        return f"{name} is a virtual or RAM-backed disk"
    device = os.path.join(sys_root, "class", "block", name, "device")
    label = " ".join(filter(None, (_read(os.path.join(device, "vendor")),
                                   _read(os.path.join(device, "model")))))
    if any(word in label.lower() for word in VIRTUAL_MODELS):
        return f"{name} is a virtual disk ({label})"
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


# --- SMART ---------------------------------------------------------------------------------------


@dataclass
class Health:
    """One disk's SMART verdict: status is ok, warn, fail or unavailable (a warning: we cannot tell)."""

    device: str
    status: str
    reasons: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"device": self.device, "status": self.status, "reasons": self.reasons, **self.facts}


def exit_bits(code: int) -> list[int]:
    return [bit for bit in range(8) if code & (1 << bit)]


def smart_health(device: str, smartctl: str = "smartctl", timeout: float = 60) -> Health:
    """Runs `smartctl --json -a DEVICE` and judges the answer; never raises."""
    binary = shutil.which(smartctl)
    if binary is None:
        return Health(device, "unavailable", ["smartctl not found (install smartmontools)"])
    try:
        proc = processes.run([binary, "--json", "-a", device], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Health(device, "unavailable", [f"smartctl did not answer: {e}"])
    try:
        data = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        data = {}
    return judge(device, data, proc.returncode)


def judge(device: str, data: dict, code: int) -> Health:
    """Turns smartctl's JSON and exit status into a verdict with its reasons."""
    bits = exit_bits(code)
    messages = [m.get("string", "") for m in data.get("smartctl", {}).get("messages", [])]
    if any(b in UNREADABLE_BITS for b in bits) or not data:
        why = "; ".join(messages) or "; ".join(EXIT_BITS[b] for b in bits) or "no output"
        if "permission denied" in why.lower():
            why += " (run as root; in a container add --cap-add SYS_RAWIO/SYS_ADMIN and --device)"
        return Health(device, "unavailable", [why], {"exit_status": code})

    fail, warn = [], []
    facts = _common_facts(data, code)
    for bit in bits:
        (fail if bit in FAILING_BITS else warn).append(f"smartctl: {EXIT_BITS[bit]}")
    if data.get("smart_status", {}).get("passed") is False and 3 not in bits:
        fail.append("SMART overall health: FAILED")

    nvme = data.get("nvme_smart_health_information_log")
    if nvme is not None:
        _judge_nvme(nvme, facts, fail, warn)
    table = data.get("ata_smart_attributes", {}).get("table")
    if table:
        _judge_ata(table, facts, fail, warn)
    endurance = data.get("endurance_used", {}).get("current_percent")
    if endurance is not None and facts.get("percentage_used") is None:
        facts["percentage_used"] = endurance
        _judge_wear(endurance, fail, warn)

    temperature = facts.get("temperature_c")
    if temperature is not None and temperature >= TEMP_WARN_C:
        warn.append(f"temperature {temperature} C (>= {TEMP_WARN_C} C)")
    status = "fail" if fail else "warn" if warn else "ok"
    return Health(device, status, fail + warn, facts)


def _common_facts(data: dict, code: int) -> dict:
    return {
        "model": data.get("model_name"),
        "protocol": data.get("device", {}).get("protocol"),
        "smart_passed": data.get("smart_status", {}).get("passed"),
        "temperature_c": data.get("temperature", {}).get("current"),
        "power_on_hours": data.get("power_on_time", {}).get("hours"),
        "exit_status": code,
    }


def _judge_nvme(log: dict, facts: dict, fail: list, warn: list) -> None:
    critical = log.get("critical_warning", 0) or 0
    spare, threshold = log.get("available_spare"), log.get("available_spare_threshold")
    used, media = log.get("percentage_used"), log.get("media_errors", 0) or 0
    facts.update(percentage_used=used, available_spare=spare, available_spare_threshold=threshold,
                 media_errors=media, critical_warning=critical)
    if facts.get("temperature_c") is None:
        facts["temperature_c"] = log.get("temperature")
    if critical:
        meaning = [text for bit, text in NVME_CRITICAL_WARNING.items() if critical & (1 << bit)]
        fail.append(f"NVMe critical warning 0x{critical:02x}: " + ", ".join(meaning))
    if spare is not None and threshold is not None and spare <= threshold:
        fail.append(f"available spare {spare}% at or below threshold {threshold}%")
    if media:
        fail.append(f"{media} media and data integrity errors (unrecovered reads or writes)")
    if used is not None:
        _judge_wear(used, fail, warn)


def _judge_ata(table: list[dict], facts: dict, fail: list, warn: list) -> None:
    by_id = {row.get("id"): row for row in table}

    def raw(attribute_id):
        row = by_id.get(attribute_id)
        return None if row is None else row.get("raw", {}).get("value")

    reallocated, pending, uncorrectable = raw(5), raw(197), raw(198)
    facts.update(reallocated_sectors=reallocated, pending_sectors=pending,
                 offline_uncorrectable=uncorrectable)
    if reallocated:
        (fail if reallocated >= REALLOCATED_FAIL else warn).append(f"{reallocated} reallocated sectors")
    if pending:
        warn.append(f"{pending} sectors pending reallocation")
    if uncorrectable:
        fail.append(f"{uncorrectable} offline uncorrectable sectors")
    for row in table:
        when = (row.get("when_failed") or "").strip()
        if when == "now":
            fail.append(f"attribute {row.get('name')} at or below threshold now")
        elif when in ("past", "In_the_past"):
            warn.append(f"attribute {row.get('name')} was at or below threshold in the past")
    for attribute_id in LIFE_LEFT_ATTRIBUTES:
        row = by_id.get(attribute_id)
        if row is not None and 0 <= (row.get("value") or 0) <= 100:
            facts["percentage_used"] = 100 - row["value"]
            _judge_wear(facts["percentage_used"], fail, warn)
            break


def _judge_wear(used: int, fail: list, warn: list) -> None:
    if used >= WEAR_FAIL_PCT:
        fail.append(f"{used}% of rated endurance used")
    elif used >= WEAR_WARN_PCT:
        warn.append(f"{used}% of rated endurance used")
