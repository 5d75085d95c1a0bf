"""`python -m components.preflight --root ROOT`: know the machine before blaming the model.

A worn NVMe drive quietly halves data loading, a container with a 64 MB /dev/shm hangs the
loaders, a GPU on a x4 link idles at 30%. `run_checks` looks at each of these before any GPU hour
is spent and returns a Report: one Check per fact, each ok, warn, fail or skip, with the reason and
the flag that fixes it. Nothing here raises on an odd machine; what cannot be measured is a warning
that says why.
"""
from __future__ import annotations

import sys

from components.common import program
from components.common.spans import Spans
from components.common.store_errors import problem
from components.contracts.config import PreflightConfig, ShardCacheConfig, TrainConfig
from components.contracts.results import ResultError, SpanManifest
from components.contracts.run_config import RunConfig
from components.preflight.checks import Check, Report
from components.preflight.gpus import gpu_check, tensorflow_check
from components.preflight.limits import cpu_check, memlock_check, open_files_check, shm_check
from components.preflight.network import NAME as NETWORK_CHECK
from components.preflight.network import network_check
from components.preflight.source import source_check
from components.preflight.storage import disk_health, free_space, local_path, read_throughput, shard_cache, writable
from components.preflight.weights import NAME as WEIGHTS_CHECK
from components.preflight.weights import imagenet_check, imagenet_network


def preflight(config: RunConfig) -> Report:
    """The checks `config.preflight` asks for, of ROOT, SOURCE and the shard cache of `config`, and of the network
    and weights its training starts from."""
    settings = config.preflight or PreflightConfig()  # a configuration that skips them, run by hand anyway
    # train's settings as training has them: the preset filled (a resolved configuration, config.json, is unchanged)
    return run_checks(config.root, source=config.source, require_gpu=settings.require_gpu,
                      min_read_mbps=settings.min_read_mbps, sample_mb=settings.sample_mb, cache=config.shard_cache,
                      network=config.resolved().train)


def run_checks(root: str, source: str | None = None, require_gpu: bool = False,
               min_read_mbps: float | None = None, *, sample_mb: int = 256,
               mounts_text: str | None = None, sys_root: str = "/sys",
               smartctl: str = "smartctl", cache: ShardCacheConfig | None = None,
               network: TrainConfig | None = None) -> Report:
    """Every preflight check for training from ROOT and ingesting from SOURCE, and for the network `network` (train's
    settings, the preset filled) names and the ImageNet weights it starts from, when it does.
    SOURCE comes first, and alone when it fails: a run that cannot read its input need not wait for TensorFlow's
    import to say so. The network next: a settings problem, said before the machine's."""
    found = [source_check(source)] if source else []
    if found and found[0].status == "fail":
        return Report(found)
    if network is not None:
        found.append(_guarded(NETWORK_CHECK, network_check, network, root))
    local_root = local_path(root)
    paths = {"ROOT": local_root} if local_root else {}
    if source and local_path(source):
        paths["source"] = local_path(source)
    manifests, broken = _manifests(root)
    checks = found + (_guarded("disk health", disk_health, paths, mounts_text, sys_root, smartctl) if paths else [
        Check("disk health", "skip", f"ROOT {root} is not a local path; its store keeps its own disks")])
    checks.append(_guarded("read throughput", read_throughput, root, manifests, sample_mb, min_read_mbps))
    checks.append(_guarded("free space", free_space, root, manifests))
    cache = cache or ShardCacheConfig()
    checks.append(_guarded("shard cache", shard_cache, root, manifests, cache.dir, cache.max_gb))
    checks.append(_guarded("ROOT writable", writable, root))
    imagenet = imagenet_network(network) if network is not None else None
    if imagenet:
        checks.append(_guarded(WEIGHTS_CHECK, imagenet_check, imagenet))
    gpu = _guarded("GPU", gpu_check, require_gpu)
    gpus = gpu.facts.get("count", 0)
    checks += [gpu, _guarded("TensorFlow GPUs", tensorflow_check, require_gpu, gpus),
               _guarded("CPU cores", cpu_check, gpus), _guarded("/dev/shm", shm_check, gpus),
               _guarded("memlock", memlock_check), _guarded("open files", open_files_check)]
    if broken:
        checks.append(broken)
    return Report(checks)


def _guarded(name: str, check, *args):
    """Runs one check; a surprise on an odd machine becomes a warning naming it, not a crash."""
    try:
        return check(*args)
    except Exception as e:  # a preflight must report, never stop the report
        store = problem(e, *(arg for arg in args if isinstance(arg, str) and "://" in arg))
        found = Check(name, "warn", f"could not check: {store or f'{type(e).__name__}: {e}'}")
        return [found] if name == "disk health" else found


def _manifests(root: str) -> tuple[list[SpanManifest], Check | None]:
    """The published spans' manifests, checked by the data check or not (training reads them once they
    are); a broken one fails the check, since every stage would stop on it."""
    try:
        return Spans(root).manifests(checked=False), None
    except ResultError as error:
        return [], Check("span manifests", "fail", str(error),
                         "restore the file from a backup")
    except (OSError, ValueError):
        return [], None


def render(report: Report):
    """The report as a rich Table for the terminal."""
    from rich.markup import escape
    from rich.table import Table

    colour = {"ok": "green", "skip": "dim", "warn": "yellow", "fail": "bold red"}
    table = Table(title="stoke preflight", show_lines=False)
    for column in ("check", "status", "finding", "fix"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", escape(program.printable(c.summary)),
                      escape(program.printable(c.fix or "")))
    return table


def run(argv: list[str] | None = None) -> int:
    """`stoke preflight`: the table on a terminal (the report as JSON with --json); exit 1 on a failed check."""
    args = program.stage_arguments("preflight", argv)
    done: list[Report] = []

    def work() -> dict:
        config, _ = program.stage_config("preflight", args)
        done.append(preflight(config))
        return done[0].to_dict()

    def describe(summary: dict) -> str:
        from rich.console import Console

        Console().print(render(done[0]))
        return f"preflight: {summary['status']} ({len(done[0].warnings)} warnings)"

    code = program.main("stoke preflight", args.json, work, describe)
    if code == 0 and done[0].failed:
        print(f"stoke preflight: {program.printable(done[0].failure_line())}", file=sys.stderr, flush=True)
        # A store that did not answer may next time; a missing path or refused credentials will not; a network that
        # does not keep the contract is a setting to change.
        failed = done[0].failed
        if all(check.facts.get("transient") for check in failed):
            return program.TRANSIENT
        return program.BAD_SETTINGS if all(check.facts.get("settings") for check in failed) else program.FAILED
    return code
