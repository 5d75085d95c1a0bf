"""What goes wrong in a simulated year, and what a person does about it.

- during a night's run, at a drawn point (a stage's program seen in the run's process tree, then a
  drawn delay): SIGKILL of `stoke run` or of that stage's program, a disk that fills, a store that
  answers errors for a while, a second run at once, `stoke rollback`, `stoke runs prune`, a shard of a
  published span replaced while training reads it;
- by hand, before a night: a span deleted or edited, a served version removed or cut short, the
  serving context's copy changed, a run's candidate made a link to the served version, the serving
  context's commands.json edited (and the push run again), a foreign SavedModel put at a rolled-back
  number;
- the next morning: held spans released with the command the report prints, a rollback, the killed
  run run again with its id, the full disk cleared.

Each returns what it did in a few words, or why it did nothing ("not applicable: ..."), for the night's
line and a failure's events.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from benchmarks.year_schedule import Event
from benchmarks.year_world import MODEL, Attempt, World, as_printed, read_json, remove

PROGRAMS = {"preflight": "components.preflight", "ingest": "beam_jobs.ingest", "datacheck": "components.datacheck",
            "train": "components.train", "gate": "components.gate", "push": "components.push"}
STAGE_WAIT_SECONDS = 600
DISK_MB = 400
BALLAST = ".year-ballast"


# ---------------------------------------------------------------- the run's process tree


def stage_program(process: subprocess.Popen, stage: str) -> psutil.Process | None:
    """The process of `stage`'s program under the run, if it runs now."""
    module = PROGRAMS[stage]
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            line = child.cmdline()
        except psutil.Error:
            continue
        if "-m" in line and module in line:
            return child
    return None


def wait_for_stage(process: subprocess.Popen, stage: str, run_dir: Path) -> psutil.Process | bool:
    """Waits until `stage` runs (its program is seen; the report: once the retention rule has written its
    record); its process, True for the report, False when the run ended first."""
    deadline = time.monotonic() + STAGE_WAIT_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        if stage == "report":
            if (run_dir / "retention.json").exists():
                return True
        else:
            found = stage_program(process, stage)
            if found is not None:
                return found
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- a disk that fills


class Disk:
    """ROOT's file system: a tmpfs of its own where one can be mounted here, so that it can be filled."""

    def __init__(self, folder: Path):
        self.folder = folder
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        self.mounted = done.returncode == 0
        self.why_not = None if self.mounted else (done.stderr.strip() or f"mount exited {done.returncode}")

    def fill(self) -> str:
        if not self.mounted:
            return f"skipped: no file system of its own for ROOT ({self.why_not})"
        ballast = self.folder / BALLAST
        for size in (1 << 20, 4096, 1):  # big writes, then the last bytes too
            try:
                with open(ballast, "ab") as f:
                    while True:
                        f.write(b"\0" * size)
                        f.flush()
            except OSError:
                pass
        return f"disk full ({shutil.disk_usage(self.folder).free} bytes free)"

    def full(self) -> bool:
        return (self.folder / BALLAST).exists()

    def free(self) -> str:
        if not self.full():
            return "not applicable: the disk is not full"
        (self.folder / BALLAST).unlink()
        return "disk cleared"

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)


# ---------------------------------------------------------------- during the night's run


def during(world: World, disk: Disk, site, fault: Event, process: subprocess.Popen, attempt: Attempt) -> str:
    """Applies a run fault while `process` runs; returns what it did."""
    p, run_dir = fault.params, world.root / "runs" / attempt.run_id
    if fault.kind == "store_errors":
        if site is None:
            return "not applicable: SOURCE is a local folder"
        time.sleep(p["after"])
        site.errors(p["seconds"], p["share"])
        return f"the store answered 503 to {p['share']:.0%} of requests for {p['seconds']} s"
    found = wait_for_stage(process, p["stage"], run_dir)
    if found is False:
        return f"not applicable: the run ended before {p['stage']}"
    time.sleep(p["after"])
    if process.poll() is not None:
        return f"not applicable: the run ended within {p['after']} s of {p['stage']}"
    if fault.kind == "kill_run":
        os.kill(process.pid, signal.SIGKILL)
        return f"SIGKILL to stoke run {p['after']} s into {p['stage']}"
    if fault.kind == "kill_stage":
        try:
            found.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return f"not applicable: {p['stage']} ended within {p['after']} s"
        return f"SIGKILL to {p['stage']}'s program (pid {found.pid}) {p['after']} s in"
    if fault.kind == "disk_full":
        return f"{disk.fill()} {p['after']} s into {p['stage']}"
    if fault.kind == "rollback":
        done = world.stoke("rollback", "--root", str(world.root), "--reason", "year: rollback during a run", "--json",
                           name="rollback-during")
        return f"stoke rollback {p['after']} s into {p['stage']}: exit {done.returncode}: {said(done)}"
    if fault.kind == "prune":
        done = world.stoke("runs", "prune", "--root", str(world.root), "--keep", "1", "--keep-records", "3", "--json",
                           name="prune-during")
        return f"stoke runs prune --keep 1 --keep-records 3 {p['after']} s into {p['stage']}: exit {done.returncode}: " \
               f"{said(done)}"
    if fault.kind == "shard_replaced":
        return replace_shard(world)
    raise ValueError(f"not a run fault: {fault.kind}")


def replace_shard(world: World) -> str:
    """The biggest train shard of the oldest span replaced by another span's (valid records, not the published
    ones); put back after the night (World.restores)."""
    spans = sorted((world.root / "data" / "spans").glob("span-*/_MANIFEST.json"))
    if len(spans) < 2:
        return "not applicable: fewer than two spans"
    target = max(spans[0].parent.glob("train-*"), key=lambda p: p.stat().st_size, default=None)
    other = max(spans[-1].parent.glob("train-*"), key=lambda p: p.stat().st_size, default=None)
    if target is None or other is None:
        return "not applicable: no train shards"
    keep = world.work / "restore" / target.name
    keep.parent.mkdir(exist_ok=True)
    shutil.copy2(target, keep)
    world.restores.append((target, keep))
    shutil.copyfile(other, target)
    return f"{target.relative_to(world.root)} replaced by {other.relative_to(world.root)} while training"


# ---------------------------------------------------------------- by hand, before the night


def by_hand(world: World, fault: Event, rng) -> str:
    root, models = world.root, world.models
    spans = sorted(p.parent for p in (root / "data" / "spans").glob("span-*/_MANIFEST.json"))
    served = world.newest_version()
    if fault.kind == "span_deleted":
        if not spans:
            return "not applicable: no span"
        shutil.rmtree(spans[-1])
        return f"{spans[-1].name} deleted by hand"
    if fault.kind == "span_edited":
        if not spans:
            return "not applicable: no span"
        span = spans[int(rng.integers(len(spans)))]
        edit = fault.params["edit"]
        if edit == "manifest":
            manifest = read_json(span / "_MANIFEST.json")
            manifest["created"] = "2020-01-01T00:00:00Z"
            (span / "_MANIFEST.json").write_text(json_text(manifest))
            return f"{span.name}/_MANIFEST.json edited (created)"
        if edit == "check_record":
            record = read_json(span / "_DATACHECK.json")
            if record is None:
                return f"not applicable: {span.name} has no check record"
            record["status"], record["reasons"] = "ok", []
            (span / "_DATACHECK.json").write_text(json_text(record))
            return f"{span.name}/_DATACHECK.json edited to ok"
        shard = max(span.glob("train-*"), key=lambda p: p.stat().st_size, default=None)
        if shard is None:
            return f"not applicable: {span.name} has no train shard"
        keep = world.work / "restore" / shard.name
        keep.parent.mkdir(exist_ok=True)
        shutil.copy2(shard, keep)
        world.restores.append((shard, keep))
        data = bytearray(shard.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
        shard.write_bytes(bytes(data))
        return f"8 bytes flipped in {span.name}/{shard.name} (put back the next morning)"
    if fault.kind == "version_removed":
        if served is None:
            return "not applicable: nothing served"
        shutil.rmtree(models / str(served))
        return f"served version {served} removed by hand"
    if fault.kind == "version_truncated":
        if served is None:
            return "not applicable: nothing served"
        data = next((models / str(served) / "variables").glob("variables.data-*"))
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
        return f"served version {served}'s {data.name} cut to half"
    if fault.kind == "mirror_edited":
        mirror = root / "serving" / "models" / MODEL
        versions = sorted(int(p.name) for p in mirror.iterdir() if p.name.isdigit()) if mirror.is_dir() else []
        if len(versions) < 2:
            return "not applicable: the serving context holds fewer than two versions"
        shutil.rmtree(mirror / str(versions[-1]) / "variables")
        shutil.copytree(mirror / str(versions[0]) / "variables", mirror / str(versions[-1]) / "variables")
        return f"serving/models/{MODEL}/{versions[-1]}/variables replaced by version {versions[0]}'s"
    if fault.kind == "candidate_linked":  # the oldest run no version came from: the next prune reduces it first
        if served is None:
            return "not applicable: nothing served"
        held = {(read_json(p) or {}).get("run_id") for p in models.glob("*/assets.extra/stoke_lineage.json")}
        runs = sorted((p for p in (root / "runs").iterdir() if (p / "report.json").exists() and p.name not in held),
                      key=lambda p: (p / "config.json").stat().st_mtime) if (root / "runs").is_dir() else []
        if not runs:
            return "not applicable: no finished run that no version came from"
        run = runs[0]
        remove(run / "candidate")
        os.symlink(f"../../models/{MODEL}/{served}", run / "candidate")
        return f"runs/{run.name}/candidate made a link to models/{MODEL}/{served}"
    if fault.kind == "commands_edited":
        commands = root / "serving" / "commands.json"
        pushed = [p.parent.name for p in (root / "runs").glob("*/pushed.json")] if (root / "runs").is_dir() else []
        if not commands.exists() or not pushed:
            return "not applicable: nothing pushed yet"
        record = read_json(commands) or {}
        record.setdefault("commands", record)
        marker = world.work / "COMMAND_RAN"
        for key in ("docker_build", "docker_build_gpu"):
            for holder in (record, record.get("commands") or {}):
                if key in holder:
                    holder[key] = f"touch {marker}"
        commands.write_text(json_text(record))
        run_id = sorted(pushed, key=lambda r: (root / "runs" / r / "pushed.json").stat().st_mtime)[-1]
        done = world.stoke("push", "--root", str(root), "--run-id", run_id, "--json", name="push-again")
        return f"serving/commands.json's build command edited; stoke push --run-id {run_id} again: exit " \
               f"{done.returncode}: {said(done)}"
    if fault.kind == "foreign_version":
        rolled = sorted(models.glob("rolled-back-*")) if models.is_dir() else []
        if not rolled or served is None:
            return "not applicable: no rolled-back version"
        number = rolled[-1].name.rsplit("-", 1)[1]
        if (models / number).exists():
            return f"not applicable: version {number} is there"
        shutil.copytree(models / str(served), models / number, ignore=shutil.ignore_patterns("assets.extra"))
        return f"version {served}'s SavedModel, without lineage, put at rolled-back number {number}"
    raise ValueError(f"not a hand edit: {fault.kind}")


def json_text(value) -> str:
    import json

    return json.dumps(value, indent=2, sort_keys=True)


# ---------------------------------------------------------------- the next morning


def morning(world: World, disk: Disk, act: Event, night: int, last: Attempt | None, killed: list[Attempt],
            later: dict[int, int]) -> str:
    """A person's act the morning after `night`. `later` maps a held span to the night it is to be released."""
    if act.kind == "release":
        return release(world, act.params["when"], night, last, later)
    if act.kind == "rollback":
        done = world.stoke("rollback", "--root", str(world.root), "--reason", "year: a person rolled back", "--json",
                           name="rollback")
        return f"stoke rollback: exit {done.returncode}: {said(done)}"
    if act.kind == "resume":
        if not killed:
            return "not applicable: no run was killed"
        return f"resume {killed[-1].run_id}"  # the runner runs it: it is a night's run like any other
    if act.kind == "free_disk":
        return disk.free()
    raise ValueError(f"not an act: {act.kind}")


def release(world: World, when: str, night: int, last: Attempt | None, later: dict[int, int]) -> str:
    """`now`: every held span is released; `later`: in two nights; `never`: it stays held. A span's fate is
    decided the first time a morning looks at it."""
    held = [span for span in world.held_spans() if later.get(span) != -1]
    if not held:
        return "not applicable: nothing held"
    if when == "now":
        return release_now(world, held, last, later)
    for span in held:
        later.setdefault(span, night + 2 if when == "later" else -1)
    return f"spans {held} {'released in two nights' if when == 'later' else 'stay held'}"


def release_now(world: World, spans: list[int], last: Attempt | None, later: dict[int, int]) -> str:
    """Releases `spans` with the commands the last run's report printed (or by hand, saying the report had none)."""
    printed = world.release_commands(world.root / "runs" / last.run_id / "report.md") if last else []
    done = []
    for span in spans:
        command = next((c for c in printed if c.split()[3] == str(span)), None)
        words = as_printed(command) if command else ["spans", "release", str(span), "--root", str(world.root)]
        result = world.stoke(*words, "--json", name=f"release-{span}")
        done.append(f"span {span} ({'as the report printed it' if command else 'the report printed no command'}): "
                    f"exit {result.returncode}: {said(result)}")
        later.pop(span, None)
    return "; ".join(done)


def said(done: subprocess.CompletedProcess) -> str:
    """A command's outcome in a line: its JSON summary's message or error, else its last line on stderr."""
    import json

    lines = [line for line in done.stdout.strip().splitlines() if line.startswith("{")]
    try:
        summary = json.loads(lines[-1]) if lines else {}
    except ValueError:
        summary = {}
    text = summary.get("error") or summary.get("message")
    if not text and summary.get("rolled_back"):
        text = f"rolled back {summary['rolled_back']}, serving {summary.get('serving_version')}"
    if not text:
        errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
        text = errors[-1] if errors else ""
    return str(text)[:200]


def restore(world: World) -> str:
    """Puts back what a fault changed for a night only (a shard replaced or flipped)."""
    put_back = []
    for target, kept in world.restores:
        if target.parent.exists():
            shutil.copyfile(kept, target)
            put_back.append(target.name)
        kept.unlink()
    world.restores.clear()
    return f"put back {', '.join(put_back)}" if put_back else ""
