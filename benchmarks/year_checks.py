"""The invariants a simulated year checks after every night, each a named check that returns what broke.

1. runs-next: nothing wedges: no lock left held, no published span left unchecked by a run that got to
   the data check, no half-written folder left by a run that ended, no night failing the way the night
   before failed when nothing was done to it, and a run that fails says why in one line (no traceback).
2. nothing-lost: every readable file of the bucket is in exactly one published span (as it is now: a file
   rewritten in place in a span published after the rewrite) or in a dead letter with its reason; every
   checked span is learnt by the served model (by span and manifest digest) or held with a reason and the
   command a person releases it with, or waits for a run that has not pushed yet; a served version no one
   took out is still whole.
3. no-regression: per class, the served model against the best any served version of the year reached on
   the held-out set (which never reaches the bucket), with the gate's own per-class test
   (components/gate/forgetting.py: McNemar's exact one-sided test, Holm over the classes, at level
   1 - gate.confidence, counting falls beyond gate.max_regression).
4. lineage-true: the served version's lineage names the spans of its run's metrics.json with the manifest
   digests they had that night, only labels those spans hold, and the start its weights came from (the
   decision training printed, or for a resumed run the decision of the attempt whose backup it resumed);
   a version without a lineage of its own is no run's; the serving context holds the repository's files but
   the answers each version's gate recorded, and a copy of each lineage that reads.
5. no-secret: SOURCE's secret in no file under ROOT (gzip members opened), in neither Prefect's database
   nor its logs, and in no line any command of the year printed.
6. bounded: run folders within the retention rule (docs/layout.md), at most push.keep versions, the shard
   cache within shard_cache.max_gb, and no more Prefect flow runs than runs started.
7. nothing-running: no process of the year's runs alive, none listening, WORK/tmp empty (but for the temporary
   folder of the stage program a `stoke run` killed outright was running), and no Prefect flow run still said to be
   running once its `stoke run` is gone and a later run of ROOT could have said it crashed.
8. data-not-command: a string read from ROOT is never run (ROOT/serving/commands.json edited by hand).
"""
from __future__ import annotations

import dataclasses
import fcntl
import gzip
import hashlib
import json
import os
import re
import urllib.parse
import zlib
from pathlib import Path

import numpy as np
import psutil

from benchmarks.year_world import MODEL, SETTINGS, Attempt, World, read_json
from components.common.repository import ANSWERS_FILE, ASSETS_EXTRA, LINEAGE_FILE
from flows.lost_runs import LOOK_AGAIN, START_GRACE

INVARIANTS = ("1 runs-next", "2 nothing-lost", "3 no-regression", "4 lineage-true", "5 no-secret", "6 bounded",
              "7 nothing-running", "8 data-not-command")
USABLE = ("ok", "warning", "released")
HEAVY = ("candidate", "backup", "tensorboard", "tfma", "warmup")
SLACK_SECONDS = 2.0  # a span's `created` is whole seconds
MIRROR_LINEAGE = f"{ASSETS_EXTRA}/{LINEAGE_FILE}"  # in the serving context: a copy without credentials
MIRROR_LEFT_OUT = f"{ASSETS_EXTRA}/{ANSWERS_FILE}"  # the gate's answers: nothing the server reads


def setting(name: str) -> str:
    return next(s.split("=", 1)[1] for s in SETTINGS if s.startswith(f"{name}="))


KEEP_RUNS, KEEP_RECORDS, KEEP_VERSIONS = int(setting("runs.keep")), int(setting("runs.keep_records")), \
    int(setting("push.keep"))
CACHE_BYTES = float(setting("shard_cache.max_gb")) * 1e9
LEVEL, MAX_REGRESSION = 0.05, 0.01  # gate.confidence 0.95 and gate.max_regression, their defaults


@dataclasses.dataclass
class Failure:
    invariant: str
    what: str


@dataclasses.dataclass
class NightLog:
    """What the checks know of the night just run."""

    number: int
    attempts: list[Attempt]  # this night's runs, the morning's reruns of the night before included
    faults: set[str]  # kinds of faults and hand edits that did something
    served_before: int | None
    rolled_back: bool  # a rollback ran (a fault or the morning before)
    pushed_again: bool = False

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def clean(self) -> bool:
        """Nothing stopped the night's last run from the outside: it ended on its own."""
        return bool(self.last) and not self.last.killed and not (self.faults & {"kill_run", "kill_stage", "disk_full"})


def digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


# ---------------------------------------------------------------- what ROOT holds, read plainly


@dataclasses.dataclass
class Span:
    number: int
    digest: str
    manifest: dict
    record: dict | None

    @property
    def status(self) -> str:
        """The check record's status when it is a valid record of this manifest, else `unchecked`."""
        r = self.record or {}
        if r.get("span") != self.number or r.get("manifest_sha256") != self.digest:
            return "unchecked"
        return r.get("status") or "unchecked"

    def checked_at(self) -> str:
        r = self.record or {}
        return r.get("released_at") or r.get("checked_at") or ""


def spans(root: Path) -> dict[int, Span]:
    found = {}
    for folder in sorted((root / "data" / "spans").glob("span-*")):
        manifest_path = folder / "_MANIFEST.json"
        if not manifest_path.exists() or not folder.name.split("-")[1].isdigit():
            continue
        found[int(folder.name.split("-")[1])] = Span(int(folder.name.split("-")[1]), digest(manifest_path),
                                                     read_json(manifest_path) or {}, read_json(folder / "_DATACHECK.json"))
    return found


def lineage(models: Path, version: int | None) -> dict | None:
    if version is None:
        return None
    for path in (models / str(version) / "assets.extra" / "stoke_lineage.json",
                 models / f"rolled-back-{version}" / "assets.extra" / "stoke_lineage.json",
                 models / "_retired" / f"{version}.json"):
        found = read_json(path)
        if found is not None:
            return found
    return None


def learnt(line: dict | None) -> set[tuple[int, str]]:
    return {(s["span"], s.get("manifest_sha256")) for s in (line or {}).get("spans", [])}


def iso_seconds(text: str) -> float:
    import datetime

    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


# ---------------------------------------------------------------- the checks


class Checks:
    """The invariants, with what they remember from night to night."""

    def __init__(self, world: World, bucket, secret, held_out):
        self.world, self.bucket, self.secret, self.held_out = world, bucket, secret, held_out
        self.span_history: dict[int, dict[int, Span]] = {}  # night -> spans as the night left them
        self.answers: dict[int, list[str]] = {}  # version -> its answers on the held-out set
        self.best: dict[str, tuple[float, int]] = {}  # class -> (best held-out accuracy, version)
        self.scanned_at = 0.0
        self.failed_before: dict[int, str] = {}  # night -> the error its last run failed with (no fault)
        self.signature_cache: dict[int, object] = {}

    def after(self, night: NightLog) -> list[Failure]:
        self.span_history[night.number] = spans(self.world.root)
        failures = []
        for name, check in (("1 runs-next", self.runs_next), ("2 nothing-lost", self.nothing_lost),
                            ("3 no-regression", self.no_regression), ("4 lineage-true", self.lineage_true),
                            ("5 no-secret", self.no_secret), ("6 bounded", self.bounded),
                            ("7 nothing-running", self.nothing_running), ("8 data-not-command", self.data_not_command)):
            try:
                problems = check(night)
            except Exception as error:  # a check that cannot read what it checks says so, and the year goes on
                problems = [f"the check itself failed: {type(error).__name__}: {error}"]
            failures += [Failure(name, what) for what in problems]
        return failures

    # ------------------------------------------------------------ 1

    def runs_next(self, night: NightLog) -> list[str]:
        root, problems = self.world.root, []
        for lock in (root / "data" / ".ingest.lock", self.world.models / ".lock", root / "runs" / ".prune.lock"):
            if lock.exists() and not _free(lock):
                problems.append(f"{lock.relative_to(root)} is still locked: {lock.read_text(errors='replace')[:100]}")
        for attempt in night.attempts:
            if not attempt.killed and "Traceback (most recent call last)" in attempt.err.read_text(errors="replace"):
                problems.append(f"run {attempt.run_id} printed a traceback ({attempt.status}): "
                                f"{attempt.error_line()[:200] or 'see ' + attempt.err.name}")
        last = night.last
        if night.clean() and last.status != "timeout":
            for number, span in spans(root).items():
                if span.status == "unchecked":
                    problems.append(f"span {number} is left unchecked after run {last.run_id} ended "
                                    f"({last.status}{': ' + last.error_line() if last.error_line() else ''})")
            half = [p.name for p in (root / "data" / "spans").glob("*") if not (p / "_MANIFEST.json").exists()]
            half += [p.name for p in self.world.models.glob(".push-*")] if self.world.models.is_dir() else []
            if half:
                problems.append(f"half-written folders after run {last.run_id} ended: {sorted(half)}")
            error = last.error_line() if last.status in ("failed",) or (last.exit or 0) != 0 else ""
            same = re.sub(r"\d+", "#", error)  # the same failure, whatever run or span it names
            if error and not night.faults:
                if self.failed_before.get(night.number - 1) == same:
                    problems.append(f"run {last.run_id} failed as the night before did, with nothing done to it: "
                                    f"{error[:300]}")
                self.failed_before[night.number] = same
        return problems

    # ------------------------------------------------------------ 2

    def nothing_lost(self, night: NightLog) -> list[str]:
        problems = self._files_accounted() + self._spans_accounted(night)
        before = night.served_before
        if before is not None and not night.rolled_back and not (night.faults & {"version_removed",
                                                                                  "version_truncated"}):
            folder = self.world.models / str(before)
            retired = (self.world.models / "_retired" / f"{before}.json").exists()
            if not retired and not ((folder / "saved_model.pb").exists() and any((folder / "variables").glob("*"))):
                problems.append(f"version {before}, served before the night and taken out by no one, is no longer "
                                f"whole: {sorted(p.name for p in folder.iterdir()) if folder.exists() else 'gone'}")
        return problems

    def _files_accounted(self) -> list[str]:
        """The bucket as the newest run whose ingest ended saw it: each file in a span, a dead letter or pending."""
        done = [a for a in self.world.attempts if a.bucket is not None and
                (read_json(self.world.root / "runs" / a.run_id / "ingest.json") or {}).get("error") is None and
                (self.world.root / "runs" / a.run_id / "ingest.json").exists()]
        if not done:
            return []
        newest = done[-1]
        ingest = read_json(self.world.root / "runs" / newest.run_id / "ingest.json") or {}
        pending = {self._path_of(d.get("uri", "")) for d in ingest.get("dead_letters") or [] if d.get("reason")}
        published: dict[str, list[float]] = {}  # path -> the `created` of each span holding a record of it
        dead: dict[str, str] = {}
        for span in spans(self.world.root).values():
            folder = self.world.root / "data" / "spans" / f"span-{span.number:05d}"
            created = iso_seconds(span.manifest.get("created", ""))
            for uri in _record_uris(folder / "content_index.tsv.gz"):
                published.setdefault(self._path_of(uri), []).append(created)
            letters = folder / "dead_letter.jsonl"
            for line in (letters.read_text(errors="replace").splitlines() if letters.exists() else []):
                try:
                    letter = json.loads(line)
                except ValueError:
                    continue
                dead[self._path_of(letter.get("uri", ""))] = letter.get("reason") or ""
        # an exact copy of a published file is no loss, even where no dead letter names it (a night of copies
        # only publishes nothing)
        contents = {f.sha256 for path in published if (f := self.bucket.files.get(path)) is not None}
        problems = []
        for path, f in newest.bucket.items():
            now = self.bucket.files.get(path)
            if now is None or now.sha256 != f.sha256:
                continue  # deleted or rewritten since: a later ingest answers for it
            spans_after = [c for c in published.get(path, []) if c >= int(f.mtime) - SLACK_SECONDS]
            where = f"{path} ({f.kind}, night {f.night})"
            if f.readable:
                if len(spans_after) > 1:
                    problems.append(f"{where} is in {len(spans_after)} spans")
                elif not spans_after and not dead.get(path) and path not in pending and f.sha256 not in contents:
                    problems.append(f"{where} is in no span and no dead letter (run {newest.run_id} read the bucket)")
            elif spans_after:
                problems.append(f"{where}, unreadable, was published as a record")
            elif not dead.get(path) and path not in pending:
                problems.append(f"{where}, unreadable, is in no dead letter (run {newest.run_id} read the bucket)")
        return problems[:20]

    def _path_of(self, uri: str) -> str:
        """A file's path below the bucket folder, however SOURCE named it (a local path, a URL)."""
        text = urllib.parse.unquote(uri)
        marker = str(self.bucket.folder) + "/" if not text.startswith("http") else "/bucket/"
        return text.split(marker, 1)[1] if marker in text else text

    def _spans_accounted(self, night: NightLog) -> list[str]:
        last, problems = night.last, []
        served = self.world.newest_version()
        line = lineage(self.world.models, served)
        known = learnt(line)
        cut = None
        if last is not None and last.status == "pushed":
            run_dir = self.world.root / "runs" / last.run_id
            stamp = run_dir / "datacheck.json" if (run_dir / "datacheck.json").exists() else run_dir / "config.json"
            cut = stamp.stat().st_mtime if stamp.exists() else None
        for number, span in spans(self.world.root).items():
            if span.status in USABLE and (number, span.digest) not in known:
                if last is not None and last.status == "skipped":
                    problems.append(f"span {number} (checked: {span.status}) is not learnt by served version "
                                    f"{served}, and run {last.run_id} skipped: {(last.summary or {}).get('message')}")
                elif cut is not None and served == (last.summary or {}).get("pushed_version") and \
                        iso_seconds(span.checked_at()) < cut - SLACK_SECONDS:
                    problems.append(f"span {number} (checked: {span.status} at {span.checked_at()}) is not in version "
                                    f"{served}, which run {last.run_id} pushed after it")
            if span.status == "quarantined":
                reasons = (span.record or {}).get("reasons") or []
                if not reasons:
                    problems.append(f"span {number} is held with no reason")
                report = self.world.root / "runs" / last.run_id / "report.md" if last else None
                config = self.world.root / "runs" / last.run_id / "config.json" if last else None
                held_tonight = config is not None and config.exists() and \
                    iso_seconds(span.checked_at()) >= config.stat().st_mtime - SLACK_SECONDS
                if held_tonight and report.exists() and night.clean() and \
                        f"stoke spans release {number} " not in report.read_text(errors="replace"):
                    problems.append(f"span {number} is held, and run {last.run_id}'s report prints no command to "
                                    "release it")
        return problems

    # ------------------------------------------------------------ 3

    def no_regression(self, night: NightLog) -> list[str]:
        from components.gate.forgetting import compare

        served = self.world.newest_version()
        if served is None:
            return []
        answers = self._answers(served)
        if answers is None:
            return [f"served version {served} cannot answer the held-out set"]
        labels = [d.label for d in self.held_out]
        right = np.array([a == label for a, label in zip(answers, labels)])
        classes = sorted(set(labels))
        for name in classes:
            mask = np.array([label == name for label in labels])
            accuracy = float(right[mask].mean())
            if accuracy > self.best.get(name, (-1.0, 0))[0]:
                self.best[name] = (accuracy, served)
        reference = np.array([self._answers(self.best[label][1])[i] == label for i, label in enumerate(labels)])
        ids = [classes.index(label) for label in labels]
        table = compare(ids, right.tolist(), reference.tolist(), classes, served, LEVEL, MAX_REGRESSION)
        return [f"class {row['label']}: served version {served} gets {row['right']}/{row['example_count']} held-out "
                f"digits right, version {self.best[row['label']][1]} got {row['baseline_right']} "
                f"(p={row['p_value']:.2g})" for row in table["classes"] if row["verdict"] == "worse"]

    def _answers(self, version: int) -> list[str] | None:
        if version not in self.answers:
            from benchmarks.month import load_signature, predict

            try:
                self.answers[version] = predict(load_signature(self.world.models / str(version)), self.held_out)
            except Exception:  # a version cut short or replaced by hand: the check says it cannot answer
                return None
        return self.answers[version]

    # ------------------------------------------------------------ 4

    def lineage_true(self, night: NightLog) -> list[str]:
        problems = []
        models = self.world.models
        served = self.world.newest_version()
        if served is None:
            return []
        own = read_json(models / str(served) / "assets.extra" / "stoke_lineage.json")
        if own is None:
            done = self.world.stoke("lineage", "--root", str(self.world.root), str(served), "--json",
                                    name="lineage-check")
            said = _last_json(done.stdout) or {}
            if said.get("run_id"):
                problems.append(f"served version {served} has no lineage of its own, yet `stoke lineage` says it came "
                                f"from run {said['run_id']}")
            return problems
        run_id = own.get("run_id")
        metrics = read_json(self.world.root / "runs" / str(run_id) / "metrics.json")
        if metrics is None:
            return [f"served version {served}'s lineage names run {run_id}, which has no metrics.json"]
        named = sorted(s["span"] for s in own.get("spans", []))
        if named != sorted(metrics.get("spans") or []):
            problems.append(f"served version {served}'s lineage names spans {named}; its run {run_id} trained on "
                            f"{metrics.get('spans')}")
        trained_night = next((a.night for a in self.world.attempts if a.run_id == run_id), None)
        seen = self.span_history.get(trained_night) or {}
        labels = set()
        for s in own.get("spans", []):
            span = seen.get(s["span"])
            if span is None:
                continue
            labels |= set(span.manifest.get("labels") or [])
            if s.get("manifest_sha256") != span.digest:
                problems.append(f"served version {served}'s lineage gives span {s['span']} the manifest digest "
                                f"{str(s.get('manifest_sha256'))[:12]}; the span's manifest was {span.digest[:12]} "
                                f"on night {trained_night}")
        extra = sorted(set(own.get("labels") or []) - labels)
        if seen and extra:
            problems.append(f"served version {served} answers {extra}, which no span of its lineage holds")
        problems += self._start(served, own, metrics, run_id)
        if night.last is not None and night.last.status == "pushed":
            problems += self._mirror()
        if "shard_replaced" in night.faults and night.last is not None and night.last.status == "pushed":
            problems.append(f"run {night.last.run_id} pushed version {served} though a shard it trained on was "
                            "replaced while it trained")
        return problems

    def _start(self, served: int, own: dict, metrics: dict, run_id: str) -> list[str]:
        said = (own.get("training") or {}).get("start") or metrics.get("start") or {}
        attempts = [a for a in self.world.attempts if a.run_id == run_id and a.decision() is not None]
        if not attempts:
            return []
        truth = attempts[-1].decision()
        if (metrics.get("resumed_from_step") or 0) > 0 and len(attempts) > 1:
            truth = attempts[-2].decision()  # the weights grew from the backup the earlier attempt made
        claimed = {"kind": said.get("kind"), "from_version": said.get("from_version")}
        if claimed["kind"] == "full":
            claimed["from_version"] = None
        if claimed != truth:
            return [f"served version {served}'s lineage says its run {run_id} started {claimed}; its weights came "
                    f"from {truth}{' (resumed from a backup)' if (metrics.get('resumed_from_step') or 0) > 0 else ''}"]
        return []

    def _mirror(self) -> list[str]:
        """The serving context's copy of each version holds what components/push/serving_image.py promises: the
        version's files but the answers its gate recorded (they stay in the repository), each the same, and a
        lineage that reads (the copy is the lineage without credentials, so it may differ in those)."""
        mirror, problems = self.world.root / "serving" / "models" / MODEL, []
        for folder in sorted(mirror.glob("*")) if mirror.is_dir() else []:
            original = self.world.models / folder.name
            if not folder.name.isdigit() or not original.is_dir():
                continue
            copied = {k: v for k, v in _tree(folder).items() if k != MIRROR_LINEAGE}
            held = {k: v for k, v in _tree(original).items() if k not in (MIRROR_LINEAGE, MIRROR_LEFT_OUT)}
            differ = sorted(k for k in copied.keys() | held.keys() if copied.get(k) != held.get(k))
            if differ:
                name = differ[0]
                how = "missing" if name not in copied else "not the version's" if name not in held else "different"
                problems.append(f"serving/models/{MODEL}/{folder.name} is not the repository's version {folder.name}: "
                                f"{name} is {how}{f' (and {len(differ) - 1} more)' if len(differ) > 1 else ''}")
            if (folder / MIRROR_LINEAGE).exists() and read_json(folder / MIRROR_LINEAGE) is None:
                problems.append(f"serving/models/{MODEL}/{folder.name}/{MIRROR_LINEAGE} is not JSON")
        return problems

    # ------------------------------------------------------------ 5

    def no_secret(self, night: NightLog) -> list[str]:
        needles = self.secret.needles
        if not needles:
            return []
        started, found = self.scanned_at, []
        places = [self.world.root, self.world.logs, Path(self.world.env["PREFECT_HOME"])]
        for place in places:
            for base, _, names in os.walk(place):
                for name in names:
                    path = Path(base) / name
                    try:
                        if path.is_symlink() or not path.is_file() or (path.stat().st_mtime < started - 5 and
                                                                       not name.startswith("prefect.db")):
                            continue
                        data = _contents(path)
                    except OSError:
                        continue
                    if any(n in data for n in needles):
                        found.append(os.path.relpath(path, self.world.work.parent))
        import time

        self.scanned_at = time.time()
        return [f"the secret is in {', '.join(sorted(found)[:12])}{' ...' if len(found) > 12 else ''}"] if found else []

    # ------------------------------------------------------------ 6

    def bounded(self, night: NightLog) -> list[str]:
        root, problems = self.world.root, []
        last = night.last
        if last is not None and (root / "runs" / last.run_id / "retention.json").exists() and night.clean():
            problems += _runs_rule(root, self.world.models)
        versions = [p.name for p in self.world.models.iterdir() if p.name.isdigit() and (p / "saved_model.pb").exists()] \
            if self.world.models.is_dir() else []
        if len(versions) > KEEP_VERSIONS and night.clean():
            problems.append(f"the repository serves {len(versions)} versions; push.keep is {KEEP_VERSIONS}")
        copies = sum(p.stat().st_size for p in self.world.cache.rglob("*") if p.is_file() and not p.is_symlink())
        if copies > CACHE_BYTES:
            problems.append(f"the shard cache holds {copies / 1e6:.1f} MB; shard_cache.max_gb is {CACHE_BYTES / 1e9}")
        runs = prefect_runs(self.world.env, self.world.root)
        if runs is not None and len(runs) > len(self.world.attempts):
            problems.append(f"Prefect holds {len(runs)} flow runs for {len(self.world.attempts)} runs started")
        return problems

    # ------------------------------------------------------------ 7

    def nothing_running(self, night: NightLog) -> list[str]:
        problems = [f"still running: pid {pid}: {line}" for pid, line in leftovers(self.world)]
        left = sorted(p.name for p in self.world.tmp.iterdir())
        # Each stage program runs in a temporary folder of its own (stoke-<stage>-*), which it removes as it exits
        # and the flow removes once it ended (flows/programs.py). A `stoke run` killed outright leaves that of the
        # program it was running: the program died with it (SIGTERM) and the flow that would remove it is gone.
        killed = any(a.killed for a in night.attempts)
        unexpected = [name for name in left if not (killed and name.startswith("stoke-"))]
        if unexpected:
            problems.append(f"left in the runs' temporary folder: {unexpected[:8]} (kept in "
                            f"leftovers/night-{night.number})")
        if left:  # moved aside, to look at, so that the next night's are its own
            aside = self.world.work / "leftovers" / f"night-{night.number}"
            aside.mkdir(parents=True, exist_ok=True)
            for path in self.world.tmp.iterdir():
                path.rename(aside / path.name)
        # A run killed outright cannot say so: the next run of ROOT says it crashed (flows/lost_runs.py), once
        # the dead run is START_GRACE old. So a flow run still said running is a failure when a run started
        # after it by more than that: it should have been found.
        newest = max((a.started for a in self.world.attempts), default=0.0)
        running = [f"{r['name']} ({(r.get('parameters') or {}).get('run_id')})"
                   for r in prefect_runs(self.world.env, self.world.root) or []
                   if (r.get("state_type") or "") in ("RUNNING", "PENDING")
                   and newest - iso_seconds(r.get("start_time") or "") > START_GRACE + LOOK_AGAIN]
        if running:
            problems.append(f"Prefect says flow runs {running[:4]} are still running, though no `stoke run` is, and "
                            "a run of ROOT started since has not said they crashed")
        return problems

    # ------------------------------------------------------------ 8

    def data_not_command(self, night: NightLog) -> list[str]:
        marker = self.world.work / "COMMAND_RAN"
        if marker.exists():
            marker.unlink()
            return ["a command read from ROOT/serving/commands.json was run"]
        return []


# ---------------------------------------------------------------- helpers


def _free(lock: Path) -> bool:
    with open(lock, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


def _contents(path: Path) -> bytes:
    """A file's bytes and, for a gzip file, what its members hold as far as they can be read: a shard whose bytes
    were flipped is read up to the damage, which zlib meets with its own error, no OSError."""
    data = rest = path.read_bytes()
    found = []
    while rest[:2] == b"\x1f\x8b":
        member = zlib.decompressobj(31)
        try:
            for start in range(0, len(rest), 1 << 16):
                found.append(member.decompress(rest[start:start + (1 << 16)]))
                if member.eof:
                    break
        except zlib.error:
            break
        if not member.eof:
            break
        rest = member.unused_data + rest[start + (1 << 16):]
    return data + b"".join(found)


def _record_uris(index: Path) -> list[str]:
    """The source URI of every record a span's content index lists (sha256, dhash, split, label, uri)."""
    try:
        lines = gzip.decompress(index.read_bytes()).decode("utf-8", errors="replace").splitlines()
    except (OSError, EOFError):
        return []
    uris = []
    for line in lines:
        cells = line.split("\t")
        if len(cells) >= 5 and not line.startswith("#"):
            try:
                uris.append(json.loads(cells[4]))
            except ValueError:
                pass
    return uris


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): digest(p) for p in folder.rglob("*") if p.is_file()}


def _last_json(text: str) -> dict | None:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def _runs_rule(root: Path, models: Path) -> list[str]:
    """ROOT/runs against the retention rule (components/common/run_retention.py, docs/layout.md)."""
    held = set()
    for line in list(models.glob("*/assets.extra/stoke_lineage.json")) if models.is_dir() else []:
        held.add((read_json(line) or {}).get("run_id"))
    folders = []
    for folder in (root / "runs").iterdir() if (root / "runs").is_dir() else []:
        if folder.name.startswith(".") or folder.is_symlink() or not folder.is_dir():
            continue
        config, report = folder / "config.json", folder / "report.json"
        started = config.stat().st_mtime if config.exists() else folder.stat().st_mtime
        live = not report.exists() or (config.exists() and config.stat().st_mtime > report.stat().st_mtime)
        heavy = [h for h in HEAVY if (folder / h).exists() or (folder / h).is_symlink()]
        folders.append((started, folder.name, live, heavy))
    problems, trained = [], 0
    for position, (_, name, live, heavy) in enumerate(sorted(folders, reverse=True)):
        trained += bool(heavy)
        if live or name in held:
            continue
        if position >= KEEP_RECORDS:
            problems.append(f"runs/{name} is kept, older than the newest {KEEP_RECORDS} runs")
        elif heavy and trained > KEEP_RUNS:
            problems.append(f"runs/{name} keeps {heavy}, older than the newest {KEEP_RUNS} runs that trained")
    return problems


def leftovers(world: World) -> list[tuple[int, str]]:
    """Processes of the year's runs still alive: their command line names WORK, or their environment the year's
    shard cache (every command of the year has it)."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.info["pid"] in mine:
            continue
        line = " ".join(process.info["cmdline"] or [])
        try:
            ours = str(world.work) in line or process.environ().get("STOKE_CACHE_DIR") == str(world.cache)
        except psutil.Error:
            ours = str(world.work) in line
        if ours:
            found.append((process.info["pid"], line[:160]))
    return found


def prefect_runs(env: dict, root: Path) -> list[dict] | None:
    """The Prefect server's flow runs whose `root` parameter is this year's ROOT (a server may hold other years')."""
    import urllib.request

    found, offset = [], 0
    while True:
        body = json.dumps({"limit": 200, "offset": offset}).encode()
        try:
            request = urllib.request.Request(f"{env['PREFECT_API_URL']}/flow_runs/filter", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as answer:
                page = json.loads(answer.read())
        except (OSError, ValueError, KeyError):
            return None
        found += [run for run in page if str((run.get("parameters") or {}).get("root")) == str(root)]
        if len(page) < 200:
            return found
        offset += 200
