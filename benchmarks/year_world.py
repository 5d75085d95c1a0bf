"""The world of a simulated year: its folders, the Stoke commands it runs and what they printed, and
what a person does to ROOT by hand (before a night) or the next morning.

Every command the year runs is `python -m flows.cli ...` (`stoke ...`) in a process of its own, its
output kept under WORK/logs (the secret check reads them all), with the environment a nightly
deployment gives it: the year's Prefect server, a shard cache, a GPU slot and a temporary folder of its
own (WORK/tmp, which must be empty after every night), and a `docker` on PATH that only says what it
was asked (a push then builds its serving image, as on a machine with Docker).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from components.common import processes

NIGHT_TIMEOUT_SECONDS = 1200
COMMAND_TIMEOUT_SECONDS = 300
MODEL = "stoke"
# A tiny recipe: the demo preset's network and epochs at 16 px, Beam in one process, no preflight (its disk
# timing says nothing here): a night costs tens of seconds on two cores, and the gate still blesses (it must beat
# the majority class). Retention tight enough that a short year reaches it.
SETTINGS = [
    "train.image_size=16", "train.input_probe_steps=0", "train.trace_steps=none",
    'beam_args=["--direct_running_mode=in_memory","--direct_num_workers=1"]', "preflight=null",
    "push.keep=3", "runs.keep=4", "runs.keep_records=8", "shard_cache.max_gb=0.05",
]
FAKE_DOCKER = """#!/bin/sh
# A container engine that answers: records each call, builds nothing, runs no container.
echo "$@" >> "{log}"
case "$1" in
  info) echo "Server Version: 0";;
  image) echo "[{{}}]";;
  run) echo "no containers here" >&2; exit 125;;
esac
exit 0
"""


@dataclasses.dataclass
class Attempt:
    """One `stoke run` of the year: a night's, a second one at once, or a person's rerun of a run id."""

    run_id: str
    night: int
    out: Path
    err: Path
    why: str  # night, second, resume
    exit: int | None = None
    summary: dict | None = None
    killed: bool = False
    served_before: int | None = None
    seconds: float = 0.0
    started: float = 0.0  # the wall clock as it started, to set beside Prefect's times
    bucket: dict | None = None  # the bucket's files as the run started: path -> year_bucket.File

    @property
    def status(self) -> str:
        if self.killed:
            return "killed"
        return (self.summary or {}).get("status") or f"exit {self.exit}"

    def error_line(self) -> str:
        lines = [line for line in self.err.read_text(errors="replace").splitlines() if "stoke run: error:" in line]
        return lines[-1].split("stoke run: error:", 1)[1].strip() if lines else ""

    def decision(self) -> dict | None:
        """What training printed it would start from: {"kind": "warm"|"full", "from_version": N|None}."""
        import re

        for line in self.err.read_text(errors="replace").splitlines():
            match = re.search(r"stoke train: (warm start|full retrain): (.*)", line)
            if match:
                version = re.search(r"served version (\d+)", match.group(2))
                warm = match.group(1) == "warm start"
                return {"kind": "warm" if warm else "full",
                        "from_version": int(version.group(1)) if warm and version else None}
        return None


class World:
    """WORK's folders, ROOT, SOURCE and the environment every command of the year runs in."""

    def __init__(self, work: Path, root_name: str, api_env: dict):
        self.work = work
        self.logs, self.tmp, self.bin = work / "logs", work / "tmp", work / "bin"
        self.cache, self.disk = work / "cache", work / "disk"
        for folder in (self.logs, self.tmp, self.bin, self.cache, self.disk):
            folder.mkdir(parents=True, exist_ok=True)
        self.root = self.disk / root_name
        self.source = ""  # set once the bucket is up
        self.docker_log = work / "docker.log"
        docker = self.bin / "docker"
        docker.write_text(FAKE_DOCKER.format(log=self.docker_log))
        docker.chmod(0o755)
        code = str(Path(__file__).resolve().parents[1])
        self.env = {**os.environ, **api_env, "STOKE_CACHE_DIR": str(self.cache), "TMPDIR": str(self.tmp),
                    "STOKE_GPU_LOCK": str(work / "gpus.lock"), "TF_CPP_MIN_LOG_LEVEL": "2",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")]))}
        self.env.pop("STOKE_SOURCE", None)
        self.attempts: list[Attempt] = []
        self.restores: list[tuple[Path, Path]] = []  # (file a fault changed for one night, its copy)
        self.running: list[subprocess.Popen] = []  # runs started and not yet waited for
        self.commands = 0

    @property
    def models(self) -> Path:
        return self.root / "models" / MODEL

    # ------------------------------------------------------------ commands

    def stoke(self, *args: str, name: str, timeout: float = COMMAND_TIMEOUT_SECONDS) -> subprocess.CompletedProcess:
        """`stoke ARGS...` to its end; its output kept under logs/ as NAME.out and NAME.err."""
        self.commands += 1
        command = [sys.executable, "-m", "flows.cli", *args]
        try:
            done = processes.run(command, timeout=timeout, env=self.env, cwd=str(self.work))
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess(command, -9, "", f"year: gave up after {timeout} s")
        stem = self.logs / f"{self.commands:04d}-{name}"
        Path(f"{stem}.out").write_text(done.stdout)
        Path(f"{stem}.err").write_text(done.stderr)
        return done

    def run_command(self, run_id: str) -> list[str]:
        settings = [f"--set={s}" for s in SETTINGS]
        return [sys.executable, "-m", "flows.cli", "run", self.source, "--root", str(self.root), "--preset", "demo",
                "--skip-unchanged", "--run-id", run_id, "--json", *settings]

    def start_run(self, run_id: str, night: int, why: str, served_before: int | None) -> tuple[subprocess.Popen, Attempt]:
        self.commands += 1
        stem = self.logs / f"{self.commands:04d}-run-{run_id}"
        attempt = Attempt(run_id, night, Path(f"{stem}.out"), Path(f"{stem}.err"), why, served_before=served_before)
        with open(attempt.out, "w") as out, open(attempt.err, "w") as err:
            process = processes.start(self.run_command(run_id), stdout=out, stderr=err, env=self.env,
                                      cwd=str(self.work))
        attempt.seconds, attempt.started = time.monotonic(), time.time()
        self.attempts.append(attempt)
        self.running.append(process)
        return process, attempt

    def finish(self, process: subprocess.Popen, attempt: Attempt, timeout: float = NIGHT_TIMEOUT_SECONDS) -> Attempt:
        try:
            attempt.exit = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            processes.stop(process)
            attempt.exit = process.returncode
            attempt.summary = {"status": "timeout"}
        self.running.remove(process)
        attempt.seconds = round(time.monotonic() - attempt.seconds, 1)
        lines = [line for line in attempt.out.read_text(errors="replace").splitlines() if line.startswith("{")]
        if lines and attempt.summary is None:
            try:
                attempt.summary = json.loads(lines[-1])
            except ValueError:
                pass
        if attempt.exit == -signal.SIGKILL:
            attempt.killed = True
        return attempt

    def stop(self) -> None:
        """Stops the runs still running (the year itself was stopped)."""
        for process in self.running:
            processes.stop(process)
        self.running.clear()

    # ------------------------------------------------------------ what ROOT holds

    def newest_version(self) -> int | None:
        if not self.models.is_dir():
            return None
        versions = [int(p.name) for p in self.models.iterdir()
                    if p.name.isascii() and p.name.isdigit() and (p / "saved_model.pb").exists()]
        return max(versions, default=None)

    def held_spans(self) -> list[int]:
        held = []
        for folder in sorted((self.root / "data" / "spans").glob("span-*")):
            record = read_json(folder / "_DATACHECK.json") or {}
            if (folder / "_MANIFEST.json").exists() and record.get("status") == "quarantined":
                held.append(int(folder.name.split("-")[1]))
        return held

    def release_commands(self, report: Path) -> list[str]:
        """The `stoke spans release ...` commands a run's report prints, as printed."""
        import re

        if not report.exists():
            return []
        return sorted(set(re.findall(r"`(stoke spans release [^`]+)`", report.read_text(errors="replace"))))


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def as_printed(command: str) -> list[str]:
    """A command a report prints (`stoke spans release 3 --root '/a b'`), as a shell would split it, for `stoke`."""
    words = shlex.split(command)
    if words[:1] != ["stoke"]:
        raise ValueError(f"not a stoke command: {command}")
    return words[1:]


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
