"""ROOT/runs kept bounded: the newest runs whole, older ones as their record, the oldest gone.

A run folder's heavy parts (RunDir.heavy: the candidate, TensorBoard's logs with the profiler trace,
TFMA's output, the warm-up requests, and the backup of a run stopped mid-training; a finished run drops
its backup itself) are most of it: 2.4 of 2.6 MB for small_cnn, and an efficientnet_b0 candidate alone
is ~20 MB. Its record (configuration, the stages' results with metrics.json, report, gate verdict,
plots) is what is read later. The rule, applied as each run ends (flows/pipeline.py) and by
`stoke runs prune` (components/report/runs.py):

- the newest `runs.keep` runs that hold heavy parts keep them; older ones are reduced to their record;
- the newest `runs.keep_records` runs keep their record; older folders are deleted;
- a run whose model the repository holds (a version, served or rolled back, whose lineage names it) stays as
  it is however old. A lineage that cannot be read could name any run: the prune then removes nothing;
- a run in progress is never touched: one without a report, or whose config.json is newer than its report
  (each attempt of a run, a retry resuming from its backup too, writes config.json first and report.json
  last, also when it fails). A run killed outright writes no report: one unchanged for a week, or for twice
  its stage timeouts when that is longer (the GPU slot may keep it waiting for another run's), is over.

"Newest" goes by config.json's time, which each attempt writes first: a run retried is new again.
Nothing deletes a folder in one step, on an object store least of all, so the order says what a folder
stopped halfway holds: pruned.json first (kept: record or nothing), then the candidate's saved_model.pb
(nothing loads a candidate half gone, and the flow takes a run for trained only with it beside
metrics.json), then the rest; a deleted folder loses its marker last. The next prune finishes a folder
its marker names; a marker older than config.json is from before the run ran again, and is ignored.
One prune at a time per ROOT: it holds the lease ROOT/runs/.prune.lock (components/common/lease.py).
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import os
import posixpath
import re
import time

from components.common import clock, local_copies
from components.common.files import filesystem, is_local, read_json, read_result, write_json
from components.common.lease import LeaseError, exclusive
from components.common.program import os_error_line
from components.common.repository import Repository, model_names
from components.contracts.config import RUN_ID_PATTERN, RunsConfig
from components.contracts.layout import Root, RunDir
from components.contracts.results import ResultError
from components.contracts.retention import Pruned, RetentionSummary, RunFate
from components.contracts.run_config import Timeouts

ABANDONED = 7 * 24 * 3600.0  # seconds a run without its report may go unchanged and still be running
LEASE_WAIT = 60.0  # seconds a prune waits for another to finish before it leaves the folders to it


class RetentionError(Exception):
    """Why the rule prunes nothing this time; the message says what to do."""


@dataclasses.dataclass
class Folder:
    """A run folder as one listing of ROOT/runs shows it: each file's path within it, size and time."""

    run: RunDir
    files: dict[str, tuple[int, float]]
    marker: Pruned | None = None  # pruned.json, when it is newer than config.json

    def time(self, name: str) -> float | None:
        return self.files[name][1] if name in self.files else None

    @property
    def started(self) -> float:
        """When its latest attempt began: config.json's time, else its newest file's."""
        config = self.time("config.json")
        return self.newest if config is None else config

    @property
    def newest(self) -> float:
        return max(t for _, t in self.files.values())

    @property
    def size(self) -> int:
        return sum(size for size, _ in self.files.values())

    def heavy(self) -> list[str]:
        """Its files that belong to heavy parts."""
        parts = [_relative(self.run, uri) for uri in self.run.heavy]
        return [name for name in self.files if any(name == p or name.startswith(p + "/") for p in parts)]

    def in_progress(self, now: float) -> str | None:
        """Why the folder may belong to a live run; None when the run is over."""
        report, config = self.time("report.json"), self.time("config.json")
        if report is not None and (config is None or report >= config):
            return None
        if now - self.newest > self._abandoned_after():
            return None
        return ("no report yet" if report is None else "an attempt is under way (config.json is newer than "
                "report.json)") + f"; left alone while it changes within {self._abandoned_after() / 86400:g} days"

    def _abandoned_after(self) -> float:
        try:
            timeouts = Timeouts.model_validate((read_json(self.run.config) or {}).get("timeouts") or {})
        except (OSError, ValueError, AttributeError):
            timeouts = Timeouts()
        return max(ABANDONED, 2 * 60 * sum(timeouts.model_dump().values()))


def survey(root: Root) -> list[Folder]:
    """Every run folder under ROOT/runs, from one listing (one paginated request on an object store)."""
    fs, runs = filesystem(root.runs)
    if not fs.isdir(runs):
        return []
    found: dict[str, dict[str, tuple[int, float]]] = {}
    for path, info in fs.find(runs, detail=True).items():
        run_id, _, name = path[len(runs.rstrip("/")) + 1:].partition("/")
        if name and re.fullmatch(RUN_ID_PATTERN, run_id):
            found.setdefault(run_id, {})[name] = (int(info.get("size") or 0), _time(info))
    folders = [Folder(root.run(run_id), files) for run_id, files in sorted(found.items())]
    for folder in folders:
        marked, config = folder.time("pruned.json"), folder.time("config.json")
        if marked is not None and (config is None or marked >= config):
            try:
                folder.marker = read_result(folder.run.pruned, Pruned)
            except (ResultError, OSError):
                pass  # unread, the marker only asks for less: the rule decides afresh and writes a new one
    return folders


def held_by_repository(root: Root) -> dict[str, str]:
    """Run id -> the version of a model repository under ROOT that it trained (served, or rolled back and
    still there to put back). Raises RetentionError when a lineage cannot be read: it could name any run."""
    held = {}
    for name in model_names(root):
        repository = Repository(root, name)
        for version, how in [(v, "") for v in repository.versions()] + [(v, ", rolled back")
                                                                      for v in repository.rolled_back()]:
            try:
                lineage = repository.lineage(version, rolled_back=bool(how))
            except (OSError, ValueError) as error:
                raise RetentionError(f"the lineage of version {version} of model {name} cannot be read ({error}), "
                                     "so it could name any run: no run folder is pruned until it can be") from None
            if lineage is not None:
                held.setdefault(lineage.run_id, f"model {name} version {version}{how} came from it")
    return held


def newest_first(folders: list[Folder]) -> list[Folder]:
    """The folders by when their latest attempt began, the newest first (a tie by run id)."""
    return sorted(folders, key=lambda f: (f.started, f.run.run_id), reverse=True)


def plan(folders: list[Folder], held: dict[str, str], settings: RunsConfig, now: float) -> list[RunFate]:
    """What the rule does with each folder, newest first (pure: nothing is read or removed)."""
    fates, trained = [], 0
    for position, folder in enumerate(newest_first(folders)):
        heavy = folder.heavy()
        live = folder.in_progress(now) if folder.marker is None or folder.marker.kept == "record" else None
        kept = folder.marker.kept if folder.marker else None
        state = ("deleting" if kept == "nothing" else "in progress" if live else
                 "record" if kept == "record" or not heavy else "whole")
        trained += bool(heavy) and state in ("whole", "in progress")
        fate = RunFate(run_id=folder.run.run_id, state=state, action="keep", why="", bytes=folder.size)
        if live:
            fate.why = live
        elif folder.run.run_id in held:
            fate.why = held[folder.run.run_id]
        elif state == "deleting":
            fate.action, fate.why = "delete", "a deletion stopped halfway: finished"
        elif position >= settings.keep_records:
            fate.action, fate.why = "delete", f"older than the newest {settings.keep_records} runs"
        elif state == "whole" and trained > settings.keep:
            fate.action, fate.why = "record", f"older than the newest {settings.keep} runs that trained"
        elif state == "record" and heavy:
            fate.action, fate.why = "record", "reduced to its record halfway: finished"
        else:
            fate.why = (f"one of the newest {settings.keep} runs that trained" if state == "whole" else
                        f"its record, one of the newest {settings.keep_records} runs")
        fate.freed = {"keep": 0, "record": sum(folder.files[n][0] for n in heavy), "delete": folder.size}[fate.action]
        fates.append(fate)
    return fates


def prune(root: Root, settings: RunsConfig, dry_run: bool = False) -> RetentionSummary:
    """Applies the rule to ROOT/runs (or, with `dry_run`, says what it would do). Raises RetentionError
    when another prune holds the folders longer than LEASE_WAIT, or a lineage cannot be read; OSError
    when the store fails. A prune stopped halfway is finished by the next."""
    summary = RetentionSummary(runs_uri=root.runs, keep=settings.keep, keep_records=settings.keep_records,
                               dry_run=dry_run)
    if dry_run:
        summary.runs = plan(survey(root), held_by_repository(root), settings, time.time())
    else:
        try:
            with exclusive(root.prune_lock, "prune of the run folders", wait=LEASE_WAIT) as lease:
                # Listed under the lease: a folder another prune was deleting is seen as it left it.
                folders = {f.run.run_id: f for f in survey(root)}
                summary.runs = plan(list(folders.values()), held_by_repository(root), settings, time.time())
                for fate in (f for f in summary.runs if f.action != "keep"):
                    lease.check()  # a lease lost (a store away for minutes) means another prune may run
                    _apply(folders[fate.run_id], fate.action)
        except LeaseError as error:
            raise RetentionError(str(error)) from None
    summary.freed = sum(fate.freed for fate in summary.runs)
    return summary


def _apply(folder: Folder, action: str) -> None:
    """Reduces the folder to its record, or deletes it, in the order the module's docstring gives."""
    run = folder.run
    if folder.marker is None or folder.marker.kept != ("record" if action == "record" else "nothing"):
        marker = Pruned(run_id=run.run_id, pruned_at=clock.now(), kept="record" if action == "record" else "nothing")
        write_json(run.pruned, marker.to_json())
    for uri in [run.saved_model, *run.heavy]:
        _remove(run, _relative(run, uri))
    if action == "delete":
        for entry in sorted({name.split("/")[0] for name in folder.files} - {"pruned.json"}):
            _remove(run, entry)
        _remove(run, "")


def _remove(run: RunDir, name: str) -> None:
    """Removes the entry `name` of the run folder (a file, or a folder and all in it; "" the run folder
    itself); one already gone is no error (a prune finishing another's). On a disk the way to it is walked
    one folder at a time without following a link (local_copies.Folder): an entry that is a link is removed
    itself, and nothing below one is reached, so a link to the served version, a file elsewhere or itself
    removes only the link. A hard link is another name of its file: removing it leaves the file to its
    other names. On an object store every key under the entry's name is removed as it is spelled: a key
    holding '..' is a key of the run folder like any other, never a path to somewhere else."""
    fs, path = filesystem(run.uri)
    if not is_local(fs):
        try:
            target = posixpath.join(path, name) if name else path
            if fs.exists(target):
                fs.rm(target, recursive=True)
        except FileNotFoundError:
            pass
        return
    # ROOT/runs is where the user put it, a link to another disk included; below it nothing is followed.
    parts = [posixpath.basename(path), *(name.split("/") if name else [])]
    try:
        folder = local_copies.Folder.open(os.path.realpath(posixpath.dirname(path)), parts[:-1], create=False)
    except FileNotFoundError:
        return
    if folder is not None:
        with folder:
            folder.discard(parts[-1])


def after_run(run: RunDir) -> RetentionSummary:
    """The rule as a run ends, with the `runs` settings of its config.json, kept in retention.json
    for its report. Never raises: a prune that fails leaves the run as it was and says why in `error`."""
    settings = RunsConfig()
    try:
        settings = RunsConfig.model_validate((read_json(run.config) or {}).get("runs") or {})
        summary = prune(Root(run.root), settings)
    except Exception as error:  # pruning never fails the run that applies it
        message = os_error_line(error) if isinstance(error, OSError) else str(error) or type(error).__name__
        summary = RetentionSummary(runs_uri=Root(run.root).runs, keep=settings.keep,
                                   keep_records=settings.keep_records, dry_run=False, error=message)
    try:
        write_json(run.retention, summary.to_json())
    except OSError:
        pass  # the store is away: the report says nothing of the prune, the log still does
    return summary


def _relative(run: RunDir, uri: str) -> str:
    return uri[len(run.uri.rstrip("/")) + 1:]


def _time(info: dict) -> float:
    """A listed file's modification time in seconds since the epoch: `mtime` on a disk, `LastModified` on S3,
    `updated` on GCS. Unknown, it counts as the newest: such a file is never the reason a folder looks old."""
    for key in ("mtime", "LastModified", "updated"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return math.inf
