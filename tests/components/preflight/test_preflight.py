import hashlib
import io
import json
import os
import resource
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.common import files
from components.common.spans import Spans
from components.contracts import layout, schema
from components.contracts.results import SpanManifest
from components.preflight import disks, gpus, limits, preflight, storage
from flows import cli
from tests.components import fake_nvml
from tests.hints import assert_runnable

FIXTURES = Path(__file__).parent / "fixtures" / "smartctl"

# /proc/mounts as a workstation with LUKS-on-LVM data, a RAID1 and a few non-disk mounts shows it.
MOUNTS = r"""sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
udev /dev devtmpfs rw,nosuid,relatime,size=32831284k,nr_inodes=8207821,mode=755,inode64 0 0
/dev/nvme0n1p2 / ext4 rw,relatime,errors=remount-ro 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev,inode64 0 0
/dev/nvme0n1p1 /boot/efi vfat rw,relatime,fmask=0077,dmask=0077,codepage=437,iocharset=ascii,errors=remount-ro 0 0
/dev/mapper/data_crypt /mnt/data ext4 rw,noatime 0 0
/dev/md0 /srv/raid xfs rw,relatime,attr2,inode64,logbufs=8,logbsize=32k,noquota 0 0
/dev/sdc1 /mnt/my\040photos ext4 rw,relatime 0 0
nas:/export/images /mnt/nas nfs4 rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp 0 0
tmpfs /mnt/data/scratch tmpfs rw,nosuid,nodev,size=1048576k 0 0
/dev/vda /vm ext4 rw,relatime 0 0
/dev/sdc1 /srv/raid/over ext4 rw,relatime 0 0
"""


def _block(sys_root: Path, device_dir: str, name: str, parent: str | None = None) -> Path:
    """One sysfs block node: the device folder, /sys/class/block/NAME and (disks) /sys/block/NAME."""
    node = sys_root / "devices" / device_dir / (f"{parent}/{name}" if parent else name)
    node.mkdir(parents=True, exist_ok=True)
    (sys_root / "class" / "block").mkdir(parents=True, exist_ok=True)
    (sys_root / "class" / "block" / name).symlink_to(node)
    if parent:
        (node / "partition").write_text("1\n")
    else:
        (sys_root / "block").mkdir(exist_ok=True)
        (sys_root / "block" / name).symlink_to(node)
        (node / "slaves").mkdir()
    return node


@pytest.fixture(scope="module")
def sys_root(tmp_path_factory) -> str:
    """A sysfs tree: nvme0n1 (3 partitions), dm-0 (LVM on p3) under dm-1 (LUKS), md0 over sda1+sdb1."""
    root = tmp_path_factory.mktemp("sys")
    nvme = "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0"
    _block(root, nvme, "nvme0n1")
    for part in ("nvme0n1p1", "nvme0n1p2", "nvme0n1p3"):
        _block(root, nvme, part, parent="nvme0n1")
    for disk, port in (("sda", "ata1"), ("sdb", "ata2"), ("sdc", "ata3")):
        path = f"pci0000:00/0000:00:17.0/{port}/host0/target0:0:0/0:0:0:0/block"
        node = _block(root, path, disk)
        _block(root, path, f"{disk}1", parent=disk)
        (node / "device").mkdir()
        (node / "device" / "vendor").write_text("ATA     \n")
        (node / "device" / "model").write_text("WDC WD40EFRX-68N\n")
    for name, dm_name, below in (("dm-0", "vg0-data", "nvme0n1p3"), ("dm-1", "data_crypt", "dm-0")):
        node = _block(root, "virtual/block", name)
        (node / "dm").mkdir()
        (node / "dm" / "name").write_text(dm_name + "\n")
        (node / "slaves" / below).symlink_to(root / "class" / "block" / below)
    md = _block(root, "virtual/block", "md0")
    for below in ("sda1", "sdb1"):
        (md / "slaves" / below).symlink_to(root / "class" / "block" / below)
    _block(root, "pci0000:00/0000:00:05.0/virtio2/block", "vda")
    return str(root)


@pytest.fixture()
def fake_smartctl(tmp_path, monkeypatch):
    """Puts the fake smartctl first on PATH; `answer(device, fixture)` sets what it says for a disk."""
    answers = tmp_path / "smartctl-answers"
    answers.mkdir()
    monkeypatch.setenv("FAKE_SMARTCTL_DIR", str(answers))
    monkeypatch.setenv("PATH", f"{FIXTURES / 'bin'}{os.pathsep}{os.environ['PATH']}")

    def answer(device: str, fixture: str, exit_status: int | None = None) -> None:
        data = json.loads((FIXTURES / fixture).read_text())
        if exit_status is not None:
            data["smartctl"]["exit_status"] = exit_status
        (answers / f"{device}.json").write_text(json.dumps(data, indent=1))

    answer.calls = lambda: (answers / "calls.log").read_text().splitlines() if (answers / "calls.log").exists() else []
    return answer


# --- mounts to disks -----------------------------------------------------------------------------


def test_parse_mounts_unescapes_paths():
    mounts = disks.parse_mounts(MOUNTS)
    assert disks.Mount("/dev/sdc1", "/mnt/my photos", "ext4") in mounts
    assert disks.Mount("nas:/export/images", "/mnt/nas", "nfs4") in mounts


@pytest.mark.parametrize("path, device", [
    ("/home/me/stoke", "/dev/nvme0n1p2"),
    ("/boot/efi/EFI", "/dev/nvme0n1p1"),
    ("/mnt/data", "/dev/mapper/data_crypt"),
    ("/mnt/data/stoke/root", "/dev/mapper/data_crypt"),
    ("/mnt/data/scratch/x", "tmpfs"),
    ("/mnt/database", "/dev/nvme0n1p2"),  # a sibling that shares a prefix is not under /mnt/data
    ("/mnt/my photos/cats", "/dev/sdc1"),
    ("/srv/raid/over/here", "/dev/sdc1"),
    ("/srv/raid/images", "/dev/md0"),
])
def test_mount_for_picks_the_deepest_mount(path, device):
    assert disks.mount_for(path, disks.parse_mounts(MOUNTS)).device == device


@pytest.mark.parametrize("device, expected", [
    ("/dev/nvme0n1p2", ["nvme0n1"]),
    ("/dev/nvme0n1", ["nvme0n1"]),
    ("/dev/sda1", ["sda"]),
    ("/dev/mapper/data_crypt", ["nvme0n1"]),  # LUKS -> LVM -> partition -> disk
    ("/dev/mapper/vg0-data", ["nvme0n1"]),
    ("/dev/dm-1", ["nvme0n1"]),
    ("/dev/md0", ["sda", "sdb"]),
    ("/dev/vda", ["vda"]),
    ("/dev/mapper/missing", []),
    ("/dev/sdz9", []),
    ("tmpfs", []),
    ("nas:/export/images", []),
])
def test_disks_behind_walks_partitions_mapper_and_raid(sys_root, device, expected):
    assert disks.disks_behind(device, sys_root) == expected


def test_virtual_disks_are_recognized(sys_root):
    assert "virtual" in disks.virtual_reason("vda", sys_root)
    assert disks.virtual_reason("sda", sys_root) is None
    assert disks.virtual_reason("nvme0n1", sys_root) is None


def test_device_of_path_uses_the_real_sysfs():
    name = disks.device_of_path(str(Path(__file__)))
    # On a machine whose sysfs knows the disk holding this file, that disk resolves to itself.
    if name is not None:
        assert disks.disks_behind(f"/dev/{name}")


# --- SMART verdicts ------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture, status, reasons", [
    ("nvme-healthy.json", "ok", []),
    ("nvme-failing.json", "fail", ["DISK FAILING", "critical warning 0x05: available spare below threshold, "
                                   "reliability degraded", "available spare 4% at or below threshold 10%",
                                   "23 media and data integrity errors", "error log"]),
    ("ata-failing.json", "fail", ["89 reallocated sectors", "8 sectors pending", "error log"]),
    ("ata-checksum-selftest.json", "warn", ["bad checksum", "self-test log"]),
    ("permission-denied.json", "unavailable", ["Permission denied", "run as root"]),
])
def test_smart_fixtures(fake_smartctl, fixture, status, reasons):
    fake_smartctl("disk0", fixture)
    health = disks.smart_health("/dev/disk0")
    assert health.status == status, health.reasons
    for reason in reasons:
        assert any(reason in r for r in health.reasons), (reason, health.reasons)
    if status == "ok":
        assert health.reasons == []
        assert health.facts["percentage_used"] == 3 and health.facts["temperature_c"] == 41
    assert fake_smartctl.calls() == ["--json -a /dev/disk0"]


def test_smart_facts_of_a_failing_ata_drive(fake_smartctl):
    fake_smartctl("sda", "ata-failing.json")
    facts = disks.smart_health("/dev/sda").to_dict()
    assert facts["reallocated_sectors"] == 89 and facts["pending_sectors"] == 8
    assert facts["power_on_hours"] == 41234 and facts["protocol"] == "ATA"
    # smartctl's own verdict is PASSED: the reallocation count alone fails it.
    assert facts["smart_passed"] is True and facts["exit_status"] == 64


@pytest.mark.parametrize("bits, status", [
    (0, "ok"),
    (1 << 0, "unavailable"),  # command line did not parse
    (1 << 1, "unavailable"),  # device open failed
    (1 << 2, "warn"),         # command failed or checksum error
    (1 << 3, "fail"),         # DISK FAILING
    (1 << 4, "fail"),         # prefail attributes at threshold
    (1 << 5, "warn"),         # attributes at threshold in the past
    (1 << 6, "warn"),         # error log has entries
    (1 << 7, "warn"),         # self-test log has errors
    ((1 << 5) | (1 << 3), "fail"),
])
def test_exit_status_bits(fake_smartctl, bits, status):
    fake_smartctl("nvme9n1", "nvme-healthy.json", exit_status=bits)
    health = disks.smart_health("/dev/nvme9n1")
    assert health.status == status
    assert health.facts["exit_status"] == bits
    assert disks.exit_bits(bits) == [b for b in range(8) if bits >> b & 1]


def test_judge_thresholds_beyond_smartctls_verdict():
    data = json.loads((FIXTURES / "nvme-healthy.json").read_text())
    data["nvme_smart_health_information_log"]["percentage_used"] = 85
    data["temperature"]["current"] = 74
    worn = disks.judge("/dev/nvme0n1", data, 0)
    assert worn.status == "warn"
    assert any("85% of rated endurance" in r for r in worn.reasons)
    assert any("temperature 74 C" in r for r in worn.reasons)
    data["nvme_smart_health_information_log"]["percentage_used"] = 104
    assert disks.judge("/dev/nvme0n1", data, 0).status == "fail"


def test_smartctl_missing_or_silent(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    health = disks.smart_health("/dev/sda")
    assert health.status == "unavailable" and "install smartmontools" in health.reasons[0]
    silent = tmp_path / "smartctl"
    silent.write_text("#!/bin/sh\necho 'not json'\nexit 4\n")
    silent.chmod(0o755)
    assert disks.smart_health("/dev/sda").status == "unavailable"


def test_disk_health_checks_each_disk_once(fake_smartctl, sys_root):
    fake_smartctl("nvme0n1", "nvme-failing.json")
    fake_smartctl("sda", "ata-failing.json")
    fake_smartctl("sdb", "nvme-healthy.json")
    checks = storage.disk_health(
        {"ROOT": "/mnt/data/stoke", "source": "/srv/raid/images", "cache": "/var/cache/stoke",
         "scratch": "/mnt/data/scratch/x", "nas": "/mnt/nas/in", "vm": "/vm/root"},
        mounts_text=MOUNTS, sys_root=sys_root)
    by_device = {c.facts.get("device"): c for c in checks if c.facts.get("device")}
    assert set(by_device) == {"/dev/nvme0n1", "/dev/sda", "/dev/sdb", "/dev/vda"}
    assert by_device["/dev/nvme0n1"].status == "fail"
    assert "(ROOT, cache)" in by_device["/dev/nvme0n1"].summary
    assert "critical warning" in by_device["/dev/nvme0n1"].summary
    assert by_device["/dev/sda"].status == "fail" and "89 reallocated" in by_device["/dev/sda"].summary
    assert by_device["/dev/sdb"].status == "ok"
    assert by_device["/dev/vda"].status == "warn" and "virtual" in by_device["/dev/vda"].summary
    no_disk = [c.summary for c in checks if not c.facts.get("device")]
    assert len(no_disk) == 2
    assert any("scratch" in s and "tmpfs" in s for s in no_disk)
    assert any("nas" in s and "nfs4" in s for s in no_disk)
    # One smartctl call per physical disk, none for the virtual one.
    assert sorted(fake_smartctl.calls()) == ["--json -a /dev/nvme0n1", "--json -a /dev/sda", "--json -a /dev/sdb"]


# --- the whole preflight on this machine ---------------------------------------------------------


def _noise_png(seed: int, side: int = 96) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _publish_span(root: str, number: int, records: int, shards: int = 2) -> dict:
    """A span as the ingest job publishes it; noise images make shards that GZIP cannot shrink."""
    import tensorflow as tf

    folder = layout.Root(root).span(number)
    os.makedirs(folder, exist_ok=True)
    entries = []
    for index in range(shards):
        name = layout.shard_name("train", index, shards)
        count = len(range(index, records, shards))
        with tf.io.TFRecordWriter(files.join(folder, name), "GZIP") as writer:
            for i in range(index, records, shards):
                writer.write(schema.encode_example(encoded=_noise_png(i), image_format="png", height=96,
                                                   width=96, label=i % 2, text=["a", "b"][i % 2],
                                                   source=f"file:///in/{i}.png"))
        data = open(files.join(folder, name), "rb").read()
        entries.append({"file": name, "split": "train", "records": count, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"span": number, "created": "2026-01-01T00:00:00Z", "compression": "gzip", "source": "/in",
                "counts": {"train": records, "eval": 0, "dead_letter": 0, "duplicates": 0}, "labels": ["a", "b"],
                "shards": entries, "sources": []}
    files.write_json(files.join(folder, layout.MANIFEST), manifest)
    return manifest


@pytest.fixture(scope="module")
def span_root(tmp_path_factory):
    """ROOT with span 1 (tiny), span 2 (~5 MB, the newest) and a run that trained at 400 images/s."""
    root = str(tmp_path_factory.mktemp("preflight-root"))
    _publish_span(root, 1, 4)
    manifest = _publish_span(root, 2, 180)
    files.write_json(layout.Root(root).run("20260101-000000").metrics, {"images_per_sec": 400.0, "steps": 10})
    return root, manifest


@pytest.fixture(scope="module")
def machine_report(span_root, tmp_path_factory):
    root, _ = span_root
    source = tmp_path_factory.mktemp("preflight-source")
    (source / "cat").mkdir()
    (source / "cat" / "a.png").write_bytes(b"an image by its name: the check reads no pixels")
    return preflight.run_checks(root, source=str(source), sample_mb=4)


def test_this_machine_warns_but_does_not_fail(machine_report):
    report = machine_report
    assert report.failed == [] and report.failure_line() is None
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["GPU"] == "warn"  # no NVIDIA driver here
    assert statuses["TensorFlow GPUs"] == "ok"
    assert all(c.status == "warn" for c in report.checks if c.name == "disk health")
    assert report.checks[0].name == "source" and statuses["source"] == "ok"
    assert set(statuses) >= {"disk health", "read throughput", "free space", "GPU", "TensorFlow GPUs",
                             "CPU cores", "/dev/shm", "memlock", "open files"}
    encoded = json.loads(json.dumps(report.to_dict()))
    assert encoded["status"] in ("ok", "warn") and encoded["failed"] == []
    memlock = next(c for c in report.checks if c.name == "memlock")
    assert memlock.status == "ok" or "--ulimit memlock=-1" in memlock.fix


def test_read_throughput_reads_the_newest_spans_shards(span_root, machine_report):
    _, manifest = span_root
    check = next(c for c in machine_report.checks if c.name == "read throughput")
    span_bytes = sum(s["bytes"] for s in manifest["shards"])
    assert span_bytes > 4 * 2**20, "the fixture span must be larger than the sample"
    assert check.facts["read"] == "span 2 shards"
    assert check.facts["bytes"] >= 4 * 2**20 and check.facts["mbps"] > 0
    assert check.facts["method"] in ("O_DIRECT", "fadvise DONTNEED")
    # What training needs: the last run's images/s x the newest span's bytes per image.
    per_image = span_bytes / 180
    assert check.facts["bytes_per_image"] == pytest.approx(per_image, rel=1e-3)
    assert check.facts["need_mbps"] == pytest.approx(400 * per_image / 1e6, rel=1e-2)


def test_read_throughput_against_requirements(span_root):
    root, _ = span_root
    manifests = Spans(root).manifests(checked=False)
    slow = storage.read_throughput(root, manifests, sample_mb=4, min_read_mbps=1e12)
    assert slow.status == "fail" and "below the required" in slow.summary
    hungry = list(manifests)
    hungry[-1] = hungry[-1].model_copy(update={"shards": [s.model_copy(update={"records": 1})
                                                          for s in hungry[-1].shards]})
    files.write_json(layout.Root(root).run("20260102-000000").metrics, {"images_per_sec": 1e12})
    try:
        bound = storage.read_throughput(root, hungry, sample_mb=4)
    finally:
        shutil.rmtree(layout.Root(root).run("20260102-000000").uri)
    assert bound.status == "warn" and "bound training" in bound.summary


def test_read_throughput_without_spans_times_a_temporary_file(tmp_path):
    root = tmp_path / "fresh" / "root"  # does not exist yet: the nearest parent is timed
    check = storage.read_throughput(str(root), [], sample_mb=4)
    assert check.status == "ok" and check.facts["read"] == "a temporary file"
    assert check.facts["bytes"] == 4 * 2**20
    assert list(tmp_path.iterdir()) == [], "the temporary file must be removed"


def test_the_shard_cache_check_looks_where_training_would_and_fails_a_folder_it_would_refuse(
        tmp_path, monkeypatch, s3_endpoint):
    monkeypatch.delenv("STOKE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    check = storage.shard_cache("s3://no-such-bucket/root", [], None, 1.0)
    assert check.status == "ok" and check.facts["folder"] == str(tmp_path / "xdg" / "stoke")
    assert not (tmp_path / "xdg").exists()  # looked at, not made
    shared = tmp_path / "xdg" / "stoke"
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    check = storage.shard_cache("s3://no-such-bucket/root", [], None, 1.0)
    assert check.status == "fail" and "writable by others" in check.summary and "chmod go-w" in check.fix
    (tmp_path / "link").symlink_to(shared)
    check = storage.shard_cache("s3://no-such-bucket/root", [], str(tmp_path / "link"), 1.0)
    assert check.status == "fail" and "symbolic link" in check.summary and "--shard-cache-dir" in check.fix
    assert_runnable(check.fix)


def test_free_space_against_the_next_span(tmp_path):
    free = shutil.disk_usage(tmp_path).free

    def span(size):
        return [SpanManifest(span=1, created="2026-01-01T00:00:00Z", source="/in", labels=["a"], sources=[],
                             counts={"train": 1, "eval": 0, "dead_letter": 0, "duplicates": 0},
                             shards=[{"file": "x", "split": "train", "records": 1, "bytes": size,
                                      "sha256": "0" * 64}])]

    assert storage.free_space(str(tmp_path), []).status == "ok"
    assert storage.free_space(str(tmp_path), span(1024)).status == "ok"
    assert storage.free_space(str(tmp_path), span(int(free * 0.6))).status == "warn"
    short = storage.free_space(str(tmp_path), span(10**18))
    assert short.status == "fail" and short.facts["next_span_bytes"] == 10**18
    assert storage.free_space("s3://bucket/root", span(10**18)).status == "skip"


def test_gpus_through_nvml_and_tensorflows_view(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.two_gpus())
    check = gpus.gpu_check()
    assert check.status == "warn" and "GPU 1 runs at x8 of x16" in check.summary
    assert check.facts["count"] == 2 and check.facts["cuda_driver"] == "12.4"
    assert check.facts["devices"][0]["name"] == "NVIDIA A100-SXM4-40GB"
    assert check.facts["devices"][0]["memory_gb"] == 40.0
    # The driver reports two GPUs, TensorFlow on this machine sees none.
    assert gpus.tensorflow_check(driver_gpus=2).status == "warn"
    assert gpus.tensorflow_check(require_gpu=True, driver_gpus=2).status == "fail"


def test_require_gpu_turns_no_gpu_into_a_failure():
    assert gpus.gpu_check(require_gpu=True).status == "fail"
    assert gpus.tensorflow_check(require_gpu=True).status == "fail"


def test_open_files_limit_is_read_live():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        check = limits.open_files_check()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert check.status == "warn" and check.facts["soft"] == 256 and "--ulimit nofile" in check.fix


def test_docker_default_shm_fails_only_with_gpus(monkeypatch):
    real = os.statvfs("/")
    tiny = os.statvfs_result((real.f_bsize, 4096, 16384, 16384, 16384, 0, 0, 0, 0, 255))  # 64 MiB
    monkeypatch.setattr(limits.os, "statvfs", lambda path: tiny)
    assert limits.shm_check(gpus=0).status == "warn"
    failed = limits.shm_check(gpus=8)
    assert failed.status == "fail" and "--shm-size" in failed.fix


def test_cli_json_and_exit_codes(span_root, capfd):
    root, _ = span_root
    # The cpu preset: the production one's ImageNet weights may be out of this machine's reach (test_weights.py).
    assert cli.main(["preflight", "--root", root, "--preset", "cpu", "--json", "--sample-mb", "4"]) == 0
    out = capfd.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["failed"] == [] and any(c["name"] == "GPU" for c in summary["checks"])

    assert cli.main(["preflight", "--root", root, "--preset", "cpu", "--sample-mb", "4", "--require-gpu"]) == 1
    captured = capfd.readouterr()
    assert "stoke preflight" in captured.out  # the table
    error = captured.err.strip().splitlines()[-1]
    assert error.startswith("stoke preflight: GPU failed: no GPU")


def test_the_command_refuses_a_setting_it_cannot_use_in_one_line(span_root, capfd):
    assert cli.main(["preflight", "--root", span_root[0], "--sample-mb", "0"]) == 2
    assert "--sample-mb: Input should be greater than 0" in capfd.readouterr().err


def test_bucket_root_reads_over_the_network_and_skips_local_checks(span_root, s3_bucket):
    import fsspec

    root, manifest = span_root
    bucket_root = f"s3://{s3_bucket}/root"
    fs = fsspec.filesystem("s3")
    fs.put(layout.Root(root).span(2), layout.Root(bucket_root).span(2).removeprefix("s3://"), recursive=True)
    report = preflight.run_checks(bucket_root, sample_mb=4)
    checks = {c.name: c for c in report.checks}
    assert checks["disk health"].status == "skip" and checks["free space"].status == "skip"
    read = checks["read throughput"]
    assert read.status == "ok" and read.facts["method"] == "s3 over the network"
    assert read.facts["bytes"] >= 4 * 2**20 and read.facts["read"] == "span 2 shards"


def test_a_check_that_breaks_becomes_a_warning(span_root, monkeypatch):
    def broken(*args):
        raise RuntimeError("sysfs went away")

    monkeypatch.setattr(preflight, "disk_health", broken)
    monkeypatch.setattr(preflight, "cpu_check", broken)
    report = preflight.run_checks(span_root[0], sample_mb=4)
    broken_checks = [c for c in report.checks if "sysfs went away" in c.summary]
    assert [c.name for c in broken_checks] == ["disk health", "CPU cores"]
    assert all(c.status == "warn" for c in broken_checks) and report.failed == []


def test_without_o_direct_the_cache_is_dropped_instead(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "O_DIRECT")  # as on macOS, or a filesystem that refuses it
    check = storage.read_throughput(str(tmp_path), [], sample_mb=4)
    assert check.facts["method"] == "fadvise DONTNEED" and check.facts["bytes"] == 4 * 2**20


def test_a_broken_span_manifest_is_a_failed_check_naming_it(tmp_path):
    root = str(tmp_path)
    manifest = layout.Root(root).manifest(1)
    files.write_text(manifest, "not json")
    report = preflight.run_checks(root, sample_mb=4)
    [check] = [c for c in report.checks if c.name == "span manifests"]
    assert check.status == "fail" and check.summary.startswith(f"{manifest} is not JSON")


def test_a_read_only_root_fails_preflight(tmp_path, monkeypatch, capfd):
    """Training, gate and push all write under ROOT, so a ROOT they cannot write fails. Tests run as
    root, where chmod 0o555 does not stop writes, so the write under ROOT raises EROFS here, as a
    read-only mount would."""
    import errno

    from fsspec.implementations.local import LocalFileSystem

    root = tmp_path / "root"
    root.mkdir()
    real = LocalFileSystem.pipe_file

    def read_only(self, path, *args, **kwargs):
        if str(path).startswith(str(root)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "pipe_file", read_only)
    check = storage.writable(str(root))
    assert check.status == "fail" and "Read-only file system" in check.summary and check.fix
    assert preflight.run(["--root", str(root), "--json", "--sample-mb", "4"]) == 1  # in-process, patched
    assert "stoke preflight: ROOT writable failed" in capfd.readouterr().err
    monkeypatch.undo()
    assert storage.writable(str(root)).status == "ok" and os.listdir(root) == []
