"""Which data-check record lets a span in: the rules training, the gate and `stoke spans` read records by.

A span's record (summaries.DataCheckRecord, `_DATACHECK.json`) lets it in only when it is a valid record
of that span and of its manifest as it is now: it reads as a record, names the span's number and the
SHA-256 of the `_MANIFEST.json` it judged, and holds the status its own anomalies give (a release names
who released the span and when). So a manifest edited since the check, a record copied from another span,
a status edited by hand and a record made before records named their manifest all read as unchecked, and
the next data check judges the span again. What a record cannot tell is a record rewritten whole,
anomalies and all, by someone who may write ROOT: that is who releases spans anyway.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from components.common.files import filesystem
from components.contracts.results import ResultError
from components.contracts.summaries import TRUSTED, DataAnomaly, DataCheckRecord


def verdict(anomalies: list[DataAnomaly]) -> str:
    """The status anomalies give a span: an error about it as a whole quarantines it (one about a file is for
    a person to look at), any other finding warns."""
    errors = any(a.severity == "error" and a.file is None for a in anomalies)
    return "quarantined" if errors else "warning" if anomalies else "ok"


@dataclasses.dataclass(frozen=True)
class CheckRecord:
    """A span's data-check record as read: the record, or why there is none to trust."""
    span: int
    record: DataCheckRecord | None
    problem: str | None  # a record is there but is not a valid one of this span

    @property
    def trusted(self) -> bool:
        return self.record is not None and self.record.status in TRUSTED

    def refusal(self, root: str) -> str | None:
        """Why training may not read the span, with what to do; None when it may."""
        if self.trusted:
            return None
        check = f"`stoke datacheck --root {root} --span {self.span}`"
        if self.record is not None:
            return (f"span {self.span} is quarantined by the data check ({'; '.join(self.record.reasons[:1])}); "
                    f"after looking at it, let it in with `stoke spans release {self.span} --root {root}`")
        if self.problem:
            return f"span {self.span} has no valid data-check record ({self.problem}); check it again with {check}"
        return f"span {self.span} has not been data-checked; check it with {check}"


def read_record(uri: str, number: int, manifest_sha256: Callable[[], str | None]) -> CheckRecord:
    """Span `number`'s record at `uri`, judged by the rules above; `manifest_sha256()` gives the digest of the
    span's manifest as it is now (asked only when there is a record)."""
    fs, path = filesystem(uri)
    try:
        if not fs.exists(path):
            return CheckRecord(number, None, None)
        record, digest = DataCheckRecord.read(uri), manifest_sha256()
    except ResultError as error:
        return CheckRecord(number, None, str(error))
    except OSError as error:
        return CheckRecord(number, None, f"{uri} cannot be read: {error.strerror or error}")
    if record.span != number:
        problem = f"{uri} is the record of span {record.span}, not of span {number}"
    elif record.manifest_sha256 is None:
        problem = f"{uri} was made before check records named the manifest they judged"
    elif record.manifest_sha256 != digest:
        problem = (f"{uri} was made for another _MANIFEST.json than the span's: the manifest was changed after the "
                   "check, or the record copied; if the change was not meant, restore the manifest from a backup")
    elif record.status == "released" and not (record.released_by and record.released_at):
        problem = f"{uri} says released without who released the span and when"
    elif record.status not in ("released", verdict(record.anomalies)):
        problem = f"{uri} says status {record.status!r} where its anomalies make it {verdict(record.anomalies)!r}"
    else:
        return CheckRecord(number, record, None)
    return CheckRecord(number, None, problem)
