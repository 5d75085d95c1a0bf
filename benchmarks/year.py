"""A year of unattended nights: `stoke run --skip-unchanged` night after night on real parts, with arrivals,
faults and a person's acts drawn from a seed, and the invariants checked after every night.

    python -m benchmarks.year --seed S [--seed S2 | --seed 1-5] --nights N [--replay-to NIGHT] [--keep DIR]
    stoke bench year ...
    stoke bench year --seed 3 --nights 20 --schedule        # what the seed draws, nothing run

Each night (benchmarks/year_schedule.py draws them): the bucket gets the night's files (benchmarks/year_bucket.py:
digits of all classes, one, none, a new one, a skewed mix; near-copies, re-uploads, broken and odd files, a
relabelled batch, files rewritten in place or deleted); a hand edit may change ROOT first; the nightly run
starts, and a fault may strike it at a drawn stage (benchmarks/year_faults.py); then the invariants are checked
(benchmarks/year_checks.py) and, the next morning, a person may release what is held, roll back, run a killed run
again or clear a full disk. SOURCE is the bucket folder, or on some seeds a manifest served over HTTP behind a
password or a query signature that nothing may keep.

One Prefect server serves every year of the command. A failing check prints the seed, the night, its events
and the command that replays the year up to that night (`--replay-to N` stops after night N's checks,
leaving WORK to look at). WORK holds the bucket, ROOT (on a tmpfs of its own when one can be mounted, so a
disk can fill), every command's output (logs/) and failures.jsonl.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import year_schedule as schedule
from benchmarks.year_bucket import Bucket, Site, secret_for
from benchmarks.year_checks import INVARIANTS, Checks, Failure, NightLog, leftovers
from benchmarks.year_faults import Disk, by_hand, during, morning, release_now, restore
from benchmarks.year_world import World


@dataclasses.dataclass
class YearResult:
    seed: int
    nights: list[dict]  # one line per night
    failures: list[dict]  # seed, night, events, invariant, what, replay
    kinds: set[str]  # event kinds that did something (a fault "not applicable" does not count)
    notes: list[str]


def replay_command(seed: int, nights: int, night: int, without: frozenset[str] = frozenset()) -> str:
    leave_out = f" --without {','.join(sorted(without))}" if without else ""
    return f"stoke bench year --seed {seed} --nights {nights}{leave_out} --replay-to {night} --keep /tmp/year-{seed}-{night}"


class Nights:
    """One year's nights, run in order in WORK against the Prefect server `api_env` names."""

    def __init__(self, seed: int, nights: int, work: Path, api_env: dict, say=print,
                 without: frozenset[str] = frozenset()):
        self.year = schedule.draw(seed, nights, without)
        self.without = without
        self.seed, self.count, self.work, self.say = seed, nights, work, say
        self.world = World(work, self.year.root_name, api_env)
        self.disk = Disk(self.world.disk)
        self.bucket = Bucket(work / "site", seed)
        self.secret = secret_for(self.year.secret, seed)
        self.site = Site(work / "site", self.secret, seed) if self.secret.kind != "none" else None
        self.world.source = self.site.source if self.site else str(self.bucket.folder)
        self.checks = Checks(self.world, self.bucket, self.secret, self.bucket.pictures.held_out)
        self.introduced = self.year.withheld is None
        self.later: dict[int, int] = {}  # held span -> night of its release (-1: never)
        self.morning_attempts: list = []
        self.rolled_back_this_morning = False
        self.result = YearResult(seed, [], [], set(), [])
        if not self.disk.mounted:
            self.result.notes.append(f"disk_full skipped: ROOT has no file system of its own ({self.disk.why_not})")

    def classes(self, night: int) -> list[str]:
        gone = self.year.vanishing
        return [c for c in schedule.NAMES if (c != self.year.withheld or self.introduced)
                and not (gone and c == gone[0] and night >= gone[1])]

    def run(self, replay_to: int | None = None, keep: bool = False) -> YearResult:
        """The nights up to `replay_to` (all by default); `keep`: ROOT outlives its tmpfs, copied into WORK/disk."""
        try:
            for night in self.year.nights:
                self.night(night)
                if replay_to is not None and night.number >= replay_to:
                    break
                self.next_morning(night)
        finally:
            self.close(keep=keep)
        return self.result

    # ------------------------------------------------------------ a night

    def night(self, night: schedule.Night) -> None:
        started = time.monotonic()
        rng = np.random.default_rng([self.seed, night.number, 99])
        done = [f"{night.arrivals}: {self.arrive(night, rng)}"]
        for extra in night.extras:
            done.append(f"{extra}: {self.bucket.apply(night.number, extra, self.classes(night.number), rng)}")
            self.result.kinds.add(extra.kind)
        if self.site:
            self.bucket.manifest()
        fault, faults = night.fault, set()
        if self.disk.full():
            faults.add("disk_full")
        if fault is not None and fault.kind in schedule.HAND_EDITS:
            text = by_hand(self.world, fault, rng)
            done.append(f"{fault}: {text}")
            if not text.startswith("not applicable"):
                faults.add(fault.kind)
        served_before = self.world.newest_version()
        attempts = self.morning_attempts + self.nightly_run(night, done, faults)
        self.morning_attempts = []
        log = NightLog(night.number, attempts, faults, served_before,
                       rolled_back=self.rolled_back_this_morning or "rollback" in faults)
        self.rolled_back_this_morning = False
        self.result.kinds |= faults | {night.arrivals.kind}
        failures = self.checks.after(log)
        served = self.world.newest_version()
        line = {"seed": self.seed, "night": night.number, "events": done,
                "runs": [f"{a.run_id}: {a.status}" for a in attempts], "served_version": served,
                "held_out_accuracy": self.accuracy(served), "failures": len(failures),
                "seconds": round(time.monotonic() - started, 1)}
        self.result.nights.append(line)
        self.say(json.dumps(line, ensure_ascii=False))
        for failure in failures:
            self.fail(night, done, failure)

    def arrive(self, night: schedule.Night, rng) -> str:
        event, classes = night.arrivals, self.classes(night.number)
        if event.kind != "new_class":
            return self.bucket.apply(night.number, event, classes, rng)
        if self.introduced:  # the withheld class came already (or none was): an ordinary night
            return self.bucket.apply(night.number, schedule.Event("all", {"per_class": 3}), classes, rng)
        self.introduced = True
        new = self.year.withheld
        count = self.bucket.arrive(night.number, new, event.params["count"])
        others = sum(self.bucket.arrive(night.number, c, 2) for c in classes) if event.params["with_others"] else 0
        return f"{count} digits of the new class {new}" + (f", {others} of the others" if others else "")

    def nightly_run(self, night: schedule.Night, done: list[str], faults: set[str]) -> list:
        fault = night.fault if night.fault is not None and night.fault.kind in schedule.RUN_FAULTS else None
        run_id = f"night-{night.number:04d}"
        served = self.world.newest_version()
        if fault is not None and fault.kind == "two_runs":
            first = self.start(f"{run_id}a", night.number, "night", served)
            time.sleep(fault.params["apart"])
            second = self.start(f"{run_id}b", night.number, "second", served)
            done.append(f"{fault}: two runs {fault.params['apart']} s apart")
            faults.add("two_runs")
            return [self.world.finish(*first), self.world.finish(*second)]
        process, attempt = self.start(run_id, night.number, "night", served)
        if fault is None:
            return [self.world.finish(process, attempt)]
        said: list[str] = []
        striker = threading.Thread(target=lambda: said.append(during(self.world, self.disk, self.site, fault,
                                                                     process, attempt)), daemon=True)
        striker.start()
        attempt = self.world.finish(process, attempt)
        striker.join()
        text = said[0] if said else "the fault's thread said nothing"
        done.append(f"{fault}: {text}")
        if not text.startswith(("not applicable", "skipped")):
            faults.add(fault.kind)
        return [attempt]

    def start(self, run_id: str, night: int, why: str, served: int | None):
        process, attempt = self.world.start_run(run_id, night, why, served)
        attempt.bucket = dict(self.bucket.files)
        return process, attempt

    def accuracy(self, version: int | None) -> float | None:
        answers = self.checks.answers.get(version) if version is not None else None
        if answers is None:
            return None
        return round(float(np.mean([a == d.label for a, d in zip(answers, self.bucket.pictures.held_out)])), 3)

    def fail(self, night: schedule.Night, done: list[str], failure: Failure) -> None:
        record = {"seed": self.seed, "night": night.number, "invariant": failure.invariant, "what": failure.what,
                  "events": done, "replay": replay_command(self.seed, self.count, night.number, self.without)}
        self.result.failures.append(record)
        with open(self.work / "failures.jsonl", "a") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.say(f"FAILED {failure.invariant}: seed {self.seed} night {night.number}: {failure.what}\n"
                 f"    events: {' | '.join(done)}\n    replay: {record['replay']}")

    # ------------------------------------------------------------ the next morning

    def next_morning(self, night: schedule.Night) -> None:
        done = []
        last = next((a for a in reversed(self.world.attempts) if a.night == night.number), None)
        due = [span for span, when in self.later.items() if 0 <= when <= night.number + 1]
        if due:
            done.append(f"release due: {release_now(self.world, due, last, self.later)}")
        killed = [a for a in self.world.attempts if a.night == night.number and
                  (a.killed or (night.fault and night.fault.kind in ("kill_stage", "disk_full")
                                and a.status in ("failed", "timeout")))]
        for act in night.acts:
            if act.kind == "free_disk" and not self.disk.full():
                continue
            if act.kind == "release" and not self.world.held_spans():
                continue
            text = morning(self.world, self.disk, act, night.number, last, killed, self.later)
            if act.kind == "resume" and text.startswith("resume "):
                served = self.world.newest_version()
                process, attempt = self.start(killed[-1].run_id, night.number + 1, "resume", served)
                attempt = self.world.finish(process, attempt)
                self.morning_attempts.append(attempt)
                text = f"{killed[-1].run_id} run again: {attempt.status}"
            if act.kind == "rollback" and "exit 0" in text:
                self.rolled_back_this_morning = True
            done.append(f"{act}: {text}")
            if not text.startswith("not applicable"):
                self.result.kinds.add(act.kind)
        put_back = restore(self.world)
        if put_back:
            done.append(put_back)
        if done:
            self.say(json.dumps({"seed": self.seed, "morning_after": night.number, "acts": done}, ensure_ascii=False))

    # ------------------------------------------------------------ the end

    def close(self, keep: bool) -> None:
        self.world.stop()
        if self.site:
            self.site.stop()
        for pid, line in leftovers(self.world):
            self.result.notes.append(f"left running at the end: {pid}: {line}")
        if self.disk.mounted:
            if keep:  # the folder outlives the mount: ROOT copied off the tmpfs first
                kept = self.world.work / "disk.kept"
                shutil.copytree(self.world.disk, kept, symlinks=True, ignore=shutil.ignore_patterns(".year-ballast"))
            self.disk.unmount()
            if keep:
                self.world.disk.rmdir()
                kept.rename(self.world.disk)


def run_years(seeds: list[int], nights: int, work: Path, replay_to: int | None = None, prefect_home: Path | None = None,
              say=print, without: frozenset[str] = frozenset(), keep: bool = False) -> list[YearResult]:
    """Each seed's year in WORK/seed-S, against one Prefect server (its home: PREFECT_HOME, else WORK/prefect);
    `keep`: WORK is kept, ROOT with it."""
    import os

    from benchmarks.month import start_server
    from components.common import processes

    home = prefect_home or work / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    server, env = start_server(home, {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")})
    api_env = {k: env[k] for k in ("PREFECT_API_URL", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    results = []
    try:
        for seed in seeds:
            folder = work / f"seed-{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            results.append(Nights(seed, nights, folder, {**api_env, "PREFECT_HOME": str(home)}, say,
                                  without).run(replay_to, keep))
    finally:
        processes.stop(server)
    return results


def table(results: list[YearResult]) -> str:
    """The failures, one row per kind of failure (numbers aside): where it was first seen, and how often."""
    import re

    rows: dict[tuple[str, str], list[dict]] = {}
    for result in results:
        for f in result.failures:
            shape = re.sub(r"\[[^]]*\]|\d+|[0-9a-z_]{8,}", "#", f["what"])  # the same failure, whatever it names
            rows.setdefault((f["invariant"], shape), []).append(f)
    lines = ["| invariant | first seen | nights | what | events | replay |", "| --- | --- | ---: | --- | --- | --- |"]
    for (invariant, _), found in sorted(rows.items()):
        f = found[0]
        lines.append(f"| {invariant} | seed {f['seed']} night {f['night']} | {len(found)} | {f['what'][:240]} | "
                     f"{' / '.join(f['events'])[:300]} | `{f['replay']}` |")
    return "\n".join(lines)


def seeds_of(text: str) -> list[int]:
    found = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        found += list(range(int(low), int(high or low) + 1))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stoke bench year", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", action="append", default=None, help="a seed, `1-5` or `1,4`; repeatable (default 0)")
    parser.add_argument("--nights", type=int, default=20)
    parser.add_argument("--replay-to", type=int, default=None, help="stop after this night's checks, keeping WORK")
    parser.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--schedule", action="store_true", help="print what each seed draws and run nothing")
    parser.add_argument("--without", default="", help="event kinds to leave out once drawn (e.g. `one,kill_run`), to "
                        "look past a failure known already; an arrival left out brings nothing")
    args = parser.parse_args(argv)
    kinds = schedule.ARRIVALS + schedule.EXTRAS + schedule.FAULTS + schedule.ACTS
    without = frozenset(filter(None, args.without.split(",")))
    if without - set(kinds):
        parser.error(f"--without: no such event kind: {', '.join(sorted(without - set(kinds)))}")
    signal.signal(signal.SIGTERM, _interrupted)  # stopped: the runs, the server and the mount go as at the end
    seeds = [s for text in (args.seed or ["0"]) for s in seeds_of(text)]
    if args.schedule:
        for seed in seeds:
            year = schedule.draw(seed, args.nights, without)
            print(json.dumps({"seed": seed, "secret": year.secret, "root": year.root_name, "withheld": year.withheld,
                              "vanishing": year.vanishing}, ensure_ascii=False))
            for night in year.nights:
                print(f"  night {night.number}: {night}")
        return 0
    keep = args.keep or (f"/tmp/year-{seeds[0]}-{args.replay_to}" if args.replay_to else None)
    work = Path(keep or tempfile.mkdtemp(prefix="stoke-year-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = run_years(seeds, args.nights, work, args.replay_to, without=without, keep=bool(keep))
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results), flush=True)
    counts = {name: sum(f["invariant"] == name for r in results for f in r.failures) for name in INVARIANTS}
    print(json.dumps({"seeds": seeds, "nights": sum(len(r.nights) for r in results), "failures": counts,
                      "notes": [n for r in results for n in r.notes], "work": str(work) if keep else None}), flush=True)
    return 1 if any(r.failures for r in results) else 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
