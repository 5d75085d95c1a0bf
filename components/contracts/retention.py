"""What the retention rule of ROOT/runs leaves (components/common/run_retention.py): the marker of a run
folder it prunes, and its summary (`stoke runs --json`, and retention.json of the run that applied it)."""
from __future__ import annotations

from typing import Literal

from components.contracts.results import Result

# A run folder as the rule finds it: whole (heavy parts and record), record (its heavy parts are gone, or going:
# a prune stopped halfway is finished by the next), deleting (a deletion stopped halfway), or in progress
# (no report yet, or a report older than its configuration: an attempt of the run is under way).
State = Literal["whole", "record", "deleting", "in progress"]
# What the rule does with it: keep it as it is, reduce it to its record, or delete it.
Action = Literal["keep", "record", "delete"]


class Pruned(Result):
    """ROOT/runs/<id>/pruned.json: written before the rule removes the first file of a run, so a run pruned
    halfway reads as such (on an object store a folder is deleted one object at a time)."""

    run_id: str
    pruned_at: str
    kept: Literal["record", "nothing"]  # nothing: the whole folder goes, this marker last


class RunFate(Result):
    """One run folder: what the rule found and what it does (or would do, in a dry run), and why."""

    run_id: str
    state: State
    action: Action
    why: str
    bytes: int  # the folder as found
    freed: int = 0  # bytes the action removes

    def line(self) -> str:
        return f"{self.run_id}: {self.state}, {_size(self.bytes)}; {self.action}: {self.why}"


class RetentionSummary(Result):
    """The rule applied once to ROOT/runs; `error` says why it pruned nothing (it never fails a run)."""

    runs_uri: str
    keep: int
    keep_records: int
    dry_run: bool
    runs: list[RunFate] = []
    freed: int = 0
    error: str | None = None

    def in_words(self) -> str:
        """One sentence for the run's report and log."""
        if self.error:
            return f"Pruning the older run folders failed: {self.error}; the next run's prune tries again."
        recorded = sum(r.action == "record" for r in self.runs)
        deleted = sum(r.action == "delete" for r in self.runs)
        done = " and ".join(part for part in (f"{recorded} reduced to their record" if recorded else "",
                                              f"{deleted} deleted" if deleted else "") if part) or "none pruned"
        freed = f", {'which would free' if self.dry_run else 'freeing'} {_size(self.freed)}" if recorded or deleted else ""
        return (f"Run folders: {len(self.runs)} found, {done}{freed} (the newest {self.keep} that trained stay whole, "
                f"the records of the newest {self.keep_records} are kept, and so is every run whose model the "
                "repository holds).")


def _size(count: int) -> str:
    return f"{count / 1e6:,.1f} MB" if count >= 100_000 else f"{count / 1e3:,.1f} kB"
