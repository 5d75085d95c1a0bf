"""A preflight finding: one Check per fact, gathered in a Report."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from components.contracts.summaries import PreflightSummary

SEVERITY = {"ok": 0, "skip": 0, "warn": 1, "fail": 2}


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    summary: str
    fix: str | None = None
    facts: dict = field(default_factory=dict)


@dataclass
class Report:
    checks: list[Check]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    @property
    def status(self) -> str:
        return max((c.status for c in self.checks), key=SEVERITY.__getitem__, default="ok")

    def failure_line(self) -> str | None:
        """One line naming the first failed check and why, for a terminal or a flow's log."""
        if not self.failed:
            return None
        first, more = self.failed[0], len(self.failed) - 1
        return (f"{first.name} failed: {first.summary}" + (f" (fix: {first.fix})" if first.fix else "")
                + (f" (and {more} more)" if more else ""))

    def to_dict(self) -> dict:
        """The summary, as `stoke preflight --json` prints it and the train flow keeps it."""
        return PreflightSummary(status=self.status, failed=[c.name for c in self.failed],
                                checks=[asdict(c) for c in self.checks]).to_json()
