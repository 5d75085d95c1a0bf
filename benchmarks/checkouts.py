"""The demo and a clean night of two checkouts of Stoke side by side: is B slower than A, and by how much.

    PYTHONPATH=. python -m benchmarks.checkouts --a OLD_CHECKOUT --b NEW_CHECKOUT [--rounds 3] [--keep DIR] [--json]

Each round, each checkout gets a fresh scratch folder of its own (the bucket, ROOT, PREFECT_HOME with its
SQLite database, the shard cache, TMPDIR) and runs three nights with its own code (PYTHONPATH=<checkout>,
`python -m flows.cli`, which is what `stoke` runs):

1. what `make run` does: `stoke demo BUCKET`, then `stoke run BUCKET --root ROOT --preset demo`;
2. a clean warm night: `--per-class` new digits of every class arrive in BUCKET (demo digits a little
   dimmer, drawn by `--seed`, written as the demo writes them), then `stoke run ... --skip-unchanged`;
3. a night with nothing new: the same command again.

The checkouts take turns night by night, and the one going first alternates from round to round: the
machine is shared, so a busier minute slows both alike. Only commands and options older checkouts have
are used. Per night: wall seconds; CPU seconds of the process tree (user and system, from getrusage of
the children this process waited for); each stage's seconds, from start to end of its Prefect task run
in the checkout's database (report.json records no stage durations), and `stoke demo`'s. Prints the
medians over rounds of A and B and B/A, and says where the two checkouts' outcomes (pushed, refused,
skipped) differ. The raw figures go to DIR/checkouts.json with --keep, which also keeps the scratch
folders there, or to stdout with --json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from benchmarks.month import NAMES, png

NIGHTS = {1: "demo + run", 2: "new digits, --skip-unchanged", 3: "nothing new, --skip-unchanged"}
DIMMER = (0.9, 0.97)  # night 2's digits: the demo's, their values times this much
COMMAND_TIMEOUT_SECONDS = 1800
STOP_SECONDS = 30


def arrivals(bucket: Path, per_class: int, seed: int) -> int:
    """`per_class` digits of every class as another scan of a demo digit would give them: a little dimmer
    (its 8x8 values times DIMMER, drawn by `seed`), written as the demo writes them, as
    BUCKET/<name>/arrival-<seed>-NNNN.png. New bytes the served model still reads as it reads the demo's (a
    digit moved by a pixel it misreads one time in ten, which the data check rightly calls mislabelled).
    Returns how many."""
    from sklearn.datasets import load_digits

    data = load_digits()
    rng = np.random.default_rng(seed)
    for label, name in enumerate(NAMES):
        (bucket / name).mkdir(parents=True, exist_ok=True)
        for index in rng.choice(np.flatnonzero(data.target == label), per_class, replace=False):
            pixels = data.images[index] * rng.uniform(*DIMMER)
            (bucket / name / f"arrival-{seed}-{index:04d}.png").write_bytes(png(pixels))
    return per_class * len(NAMES)


class Checkout:
    """One checkout's commands, each in its own session and timed, in one scratch folder."""

    def __init__(self, name: str, tree: Path, scratch: Path, python: str):
        self.name, self.tree, self.scratch = name, tree, scratch
        self.bucket, self.root, self.home = scratch / "bucket", scratch / "root", scratch / "prefect"
        for folder in (scratch / "tmp", self.home):
            folder.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.env = {key: value for key, value in os.environ.items()
                    if key != "PYTHONPATH" and not key.startswith(("PREFECT_", "STOKE_"))}
        self.env.update({"PYTHONPATH": str(tree), "PREFECT_HOME": str(self.home), "TMPDIR": str(scratch / "tmp"),
                         "STOKE_CACHE_DIR": str(scratch / "cache"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                         "TF_CPP_MIN_LOG_LEVEL": "3"})

    def stoke(self, *args: str, timeout: float = COMMAND_TIMEOUT_SECONDS) -> dict:
        """Runs `stoke ARGS` of this checkout: exit code, wall and CPU seconds, the load average at its start,
        and the processes its session left behind (then ended)."""
        log = self.scratch / "commands.log"
        with open(log, "ab") as out:
            out.write(f"\n$ stoke {' '.join(args)}\n".encode())
            out.flush()
            before, load, started = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0], time.monotonic()
            process = subprocess.Popen([self.python, "-m", "flows.cli", *args], cwd=self.scratch, env=self.env,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
            except BaseException:
                end_session(process)
                raise
            wall = time.monotonic() - started
            left = end_session(process)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"exit": code, "wall": round(wall, 2), "cpu": round(cpu, 2), "load": load, "left_running": left}

    def night(self, number: int, per_class: int, seed: int) -> dict:
        run = ["run", str(self.bucket), "--root", str(self.root), "--preset", "demo", "--run-id", f"night-{number}"]
        stages = {}
        if number == 1:
            demo = self.stoke("demo", str(self.bucket))
            stages["demo"] = demo["wall"]
        elif number == 2:
            arrivals(self.bucket, per_class, seed)
        command = self.stoke(*run, *(["--skip-unchanged"] if number > 1 else []))
        if number == 1:
            command["exit"] = demo["exit"] or command["exit"]
            command["left_running"] += demo["left_running"]
            for key in ("wall", "cpu"):
                command[key] = round(command[key] + demo[key], 2)
        report = self.root / "runs" / f"night-{number}" / "report.json"
        status = json.loads(report.read_text())["status"] if report.exists() else "no report"
        stages.update(task_seconds(self.home / "prefect.db"))
        return {"checkout": self.name, "night": number, "status": status, **command, "stages": stages}


def end_session(process: subprocess.Popen) -> list[str]:
    """Stops `process` and whatever else runs in its session (SIGTERM, then SIGKILL); says what was left."""
    left = [] if process.poll() is not None else [f"stoke ({process.pid})"]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not session_alive(process):
            break
        left = left or [f"processes of its session ({process.pid})"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + STOP_SECONDS
        while session_alive(process) and time.monotonic() < deadline:
            time.sleep(0.2)
    return left


def session_alive(process: subprocess.Popen) -> bool:
    process.poll()  # reaps the leader, which would otherwise stay in the session as a zombie
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def task_seconds(database: Path) -> dict[str, float]:
    """Seconds of each task of the newest flow run in a Prefect database, start to end, by task name."""
    if not database.exists():
        return {}
    with contextlib.closing(sqlite3.connect(database)) as db:
        newest = db.execute("SELECT id FROM flow_run ORDER BY created DESC LIMIT 1").fetchone()
        if newest is None:
            return {}
        rows = db.execute("SELECT name, start_time, end_time FROM task_run WHERE flow_run_id = ? AND start_time IS NOT "
                          "NULL AND end_time IS NOT NULL ORDER BY start_time", newest).fetchall()
    seconds: dict[str, float] = {}
    for name, start, end in rows:
        stage = name.rsplit("-", 1)[0]
        took = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
        seconds[stage] = round(seconds.get(stage, 0.0) + took, 2)
    return seconds


def checked(tree: Path, python: str) -> None:
    """Exits with one line unless `tree` is a checkout whose own code runs and whose `stoke run` takes the
    options used here."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([python, "-c", "import flows.cli; print(flows.cli.__file__)"], capture_output=True, text=True,
                         env=env, cwd=tempfile.gettempdir())
    if out.returncode or not Path(out.stdout.strip()).resolve().is_relative_to(tree):
        sys.exit(f"{tree}: not a checkout of Stoke whose flows.cli runs from it ({out.stderr.strip()[-200:]})")
    usage = subprocess.run([python, "-m", "flows.cli", "run", "--help"], capture_output=True, text=True, env=env,
                           cwd=tempfile.gettempdir()).stdout
    missing = [o for o in ("--root", "--preset", "--skip-unchanged", "--run-id") if o not in usage]
    if missing:
        sys.exit(f"{tree}: `stoke run` has no {', '.join(missing)}")


def commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %cs %s"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True).stdout
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty.strip() else "")


def medians(runs: list[dict]) -> dict:
    """{night: {figure: {"a": median, "b": median}}}: wall, CPU, each stage, and the wall outside the stages."""
    found: dict = {}
    for run in runs:
        figures = {"wall s": run["wall"], "CPU s": run["cpu"],
                   **{f"{stage} s": seconds for stage, seconds in run["stages"].items()},
                   "outside the stages s": round(run["wall"] - sum(run["stages"].values()), 2)}
        for figure, value in figures.items():
            found.setdefault(run["night"], {}).setdefault(figure, {"a": [], "b": []})[run["checkout"]].append(value)
    return {night: {figure: {side: statistics.median(values) if values else None for side, values in sides.items()}
                    for figure, sides in figures.items()} for night, figures in found.items()}


def table(median: dict) -> str:
    lines = ["| night | figure | A median | B median | B/A |", "| --- | --- | ---: | ---: | ---: |"]
    for night, figures in sorted(median.items()):
        for i, (figure, sides) in enumerate(figures.items()):
            a, b = sides["a"], sides["b"]
            ratio = f"{b / a:.2f}" if a and b is not None else "-"
            lines.append(f"| {f'{night}: {NIGHTS[night]}' if i == 0 else ''} | {figure} | "
                         f"{'-' if a is None else f'{a:.1f}'} | {'-' if b is None else f'{b:.1f}'} | {ratio} |")
    return "\n".join(lines)


def differences(runs: list[dict]) -> list[str]:
    """Nights whose outcome differs between the checkouts, or that failed or left processes running."""
    said = []
    by = {(r["round"], r["night"], r["checkout"]): r for r in runs}
    for (round_, night, side), run in sorted(by.items()):
        other = by.get((round_, night, "b"))
        if side == "a" and other and run["status"] != other["status"]:
            said.append(f"round {round_}, night {night}: A {run['status']}, B {other['status']}")
        if run["exit"] != 0 or run["left_running"]:
            said.append(f"round {round_}, night {night}, {side.upper()}: exit {run['exit']}, "
                        f"left running {run['left_running'] or 'nothing'}")
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkouts", description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, type=Path, help="the checkout to compare against (the older)")
    parser.add_argument("--b", required=True, type=Path, help="the checkout measured against it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=20, help="new digits of every class on night 2")
    parser.add_argument("--seed", type=int, default=1, help="draws night 2's digits and how dim")
    parser.add_argument("--python", default=sys.executable, help="the interpreter both checkouts run with")
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it, with checkouts.json")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON last")
    args = parser.parse_args(argv)
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    for tree in trees.values():
        checked(tree, args.python)
    work = (args.keep or Path(tempfile.mkdtemp(prefix="stoke-checkouts-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    figures = {"checkouts": {side: {"dir": str(tree), "commit": commit(tree)} for side, tree in trees.items()},
               "rounds": args.rounds, "per_class": args.per_class, "seed": args.seed, "cpus": os.cpu_count(),
               "runs": []}
    try:
        for round_ in range(1, args.rounds + 1):
            order = ("a", "b") if round_ % 2 else ("b", "a")
            sides = {side: Checkout(side, trees[side], work / f"round-{round_}-{side}", args.python) for side in order}
            for night in NIGHTS:
                for side in order:
                    run = {"round": round_, **sides[side].night(night, args.per_class, args.seed)}
                    figures["runs"].append(run)
                    print(json.dumps(run), file=sys.stderr, flush=True)
            if not args.keep:
                for checkout in sides.values():
                    shutil.rmtree(checkout.scratch, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures["median"] = medians(figures["runs"])
    figures["differences"] = differences(figures["runs"])
    loads = [run["load"] for run in figures["runs"]]
    print(f"A: {figures['checkouts']['a']['commit']}\nB: {figures['checkouts']['b']['commit']}\n"
          f"{args.rounds} rounds, {os.cpu_count()} cores, load average (1 min) {min(loads):.1f} to {max(loads):.1f}\n")
    print(table(figures["median"]))
    print("\n".join(["", "Differences:", *figures["differences"]]) if figures["differences"]
          else "\nSame outcome every night.")
    if args.keep:
        (work / "checkouts.json").write_text(json.dumps(figures, indent=1))
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
