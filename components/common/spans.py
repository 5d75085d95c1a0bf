"""What the spans under a ROOT hold, as stored: which are published, their manifests and shards, the
labels, and which data-check record lets a span in (components/contracts/layout.py names the files).

A span's record (DataCheckRecord, `_DATACHECK.json`) lets it in only when it is a valid record of that
span and of its manifest as it is now: it reads as a record, names the span's number and the SHA-256 of
the `_MANIFEST.json` it judged, and holds the status its own anomalies give (a release names who
released the span and when). So a manifest edited since the check, a record copied from another span,
a status edited by hand and a record made before records named their manifest all read as unchecked,
and the next data check judges the span again. What a record cannot tell is a record rewritten whole,
anomalies and all, by someone who may write ROOT: that is who releases spans anyway.
"""
from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import shlex
from collections.abc import Callable, Iterator

from components.common.files import exists, filesystem, read_bytes, read_result
from components.contracts.layout import MANIFEST, SPAN_PATTERN, TF_COMPRESSION, Root, Shard, join
from components.contracts.results import ResultError, SpanManifest, parse_json
from components.contracts.summaries import TRUSTED, DataCheckRecord, release_command, verdict


class SpanNotChecked(ValueError):
    """A span named explicitly that the data check has not let in; the message says why and what to do."""


class Spans:
    """The spans under one ROOT as they are stored: numbers, manifests, shards, labels and check records."""

    def __init__(self, root: Root | str):
        self.root = root if isinstance(root, Root) else Root(root)

    def span_numbers(self) -> list[int]:
        """Numbers of every span folder, published or not."""
        fs, path = filesystem(self.root.spans)
        if not fs.isdir(path):
            return []
        names = (posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
        return sorted(int(m.group(1)) for m in map(SPAN_PATTERN.match, names) if m)

    def published(self) -> list[int]:
        """Numbers of the published spans (those whose _MANIFEST.json exists), checked or not."""
        fs, _ = filesystem(self.root.spans)
        return [n for n in self.span_numbers() if fs.exists(filesystem(self.root.manifest(n))[1])]

    def read_labels(self) -> list[str]:
        """labels.json: label names, the index is the label id; [] before the first span."""
        if not exists(self.root.labels):
            return []
        labels = parse_json(_read(self.root.labels), self.root.labels)
        if not isinstance(labels, list) or not all(isinstance(name, str) for name in labels):
            raise ResultError(f"{self.root.labels} is not a list of label names; restore it from a backup, or remove it "
                              "and ingest rebuilds it from the spans' manifests")
        return labels

    def manifest_sha256(self, number: int) -> str | None:
        """The SHA-256 of span `number`'s manifest as it is now; None when it has none."""
        try:
            return hashlib.sha256(_read(self.root.manifest(number))).hexdigest()
        except FileNotFoundError:
            return None

    def read_manifest(self, number: int, *, sources: bool = True) -> SpanManifest:
        """Span `number`'s manifest, and the SHA-256 of the bytes it was read from (its `sha256`). Without
        `sources` its `sources` list (by far its biggest part) is left empty."""
        uri = self.root.manifest(number)
        data = _read(uri)
        return _manifest(data, hashlib.sha256(data).hexdigest(), uri, sources)

    def manifests(self, spans: list[int] | None = None, *, checked: bool = True) -> list[SpanManifest]:
        """Manifests of the published spans, oldest first.

        With `checked`, only the spans the data check let in: training and the gate read those, while
        ingest (duplicates, labels, what is already known) and the data check count every published span
        (`checked=False`). Naming a span in `spans` that the check has not let in raises SpanNotChecked,
        with why and what to do, rather than quietly reading less."""
        return list(self.each_manifest(spans, checked=checked))

    def each_manifest(self, spans: list[int] | None = None, *, checked: bool = True,
                      sources: bool = True) -> Iterator[SpanManifest]:
        """`manifests`, read one at a time: a reader that keeps little of each holds one span's in memory.
        Without `sources` each manifest's `sources` list (by far its biggest part) is left empty."""
        fs, _ = filesystem(self.root.spans)
        for number in self.span_numbers():
            if spans is not None and number not in spans:
                continue
            uri = self.root.manifest(number)
            if not fs.exists(filesystem(uri)[1]):
                continue
            data = _read(uri)
            manifest = _manifest(data, hashlib.sha256(data).hexdigest(), uri, sources)  # a damaged one is named
            why = self.check_record(number, manifest.sha256).refusal(self.root.uri) if checked else None
            if why:
                if spans is not None:
                    raise SpanNotChecked(why)
                continue
            yield manifest

    def shards(self, split: str, spans: list[int] | None = None, *, checked: bool = True) -> list[Shard]:
        """Shard files of one split across the published spans the data check let in (all published
        spans without `checked`; unpublished span folders are ignored)."""
        found = []
        for manifest in self.each_manifest(spans, checked=checked, sources=False):
            folder = self.root.span(manifest.span)
            found += [Shard(join(folder, entry.file), TF_COMPRESSION[manifest.compression], entry.records,
                            manifest.span, entry.bytes, entry.sha256, manifest.sha256)
                      for entry in manifest.shards if entry.split == split]
        return found

    def unchecked(self) -> list[int]:
        """Published spans without a valid data-check record: what the data check has still to judge."""
        return [n for n in self.published() if self.check_record(n).record is None]

    def check_record(self, number: int, sha256: str | None = None) -> CheckRecord:
        """Span `number`'s data-check record, judged by the rules above against its manifest as it is now
        (its SHA-256, read when not given): a record that is no valid one is named, and lets nothing in."""
        return _judged(self.root.datacheck(number), number, lambda: sha256 or self.manifest_sha256(number))


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
        check = f"`stoke datacheck --root {shlex.quote(root)} --span {self.span}`"
        if self.record is not None:
            return (f"span {self.span} is quarantined by the data check ({'; '.join(self.record.reasons[:1])}); "
                    f"after looking at it, let it in with `{release_command(self.span, root)}`")
        if self.problem:
            return f"span {self.span} has no valid data-check record ({self.problem}); check it again with {check}"
        return f"span {self.span} has not been data-checked; check it with {check}"


def _judged(uri: str, number: int, digest_now: Callable[[], str | None]) -> CheckRecord:
    """Span `number`'s record at `uri`; `digest_now()` gives the digest of the span's manifest as it is now
    (asked only when there is a record)."""
    fs, path = filesystem(uri)
    try:
        if not fs.exists(path):
            return CheckRecord(number, None, None)
        record, digest = read_result(uri, DataCheckRecord), digest_now()
    except ResultError as error:
        return CheckRecord(number, None, str(error))
    except OSError as error:
        return CheckRecord(number, None, f"{uri} cannot be read: {error.strerror or error}")
    if record.span != number:
        problem = f"{uri} is the record of span {record.span}, not of span {number}"
    elif record.manifest_sha256 is None:
        problem = f"{uri} was made before check records named the manifest they judged"
    elif record.manifest_sha256 != digest:
        problem = (f"{uri} was made for another {MANIFEST} than the span's: the manifest was changed after the "
                   "check, or the record copied; if the change was not meant, restore the manifest from a backup")
    elif record.status == "released" and not (record.released_by and record.released_at):
        problem = f"{uri} says released without who released the span and when"
    elif record.status not in ("released", verdict(record.anomalies)):
        problem = f"{uri} says status {record.status!r} where its anomalies make it {verdict(record.anomalies)!r}"
    else:
        return CheckRecord(number, record, None)
    return CheckRecord(number, None, problem)


def _read(uri: str) -> bytes:
    """The file's bytes; a folder in its place is a ResultError naming it, as read_result says it."""
    try:
        return read_bytes(uri)
    except IsADirectoryError:
        raise ResultError(f"{uri} is a folder, not a file") from None


def _manifest(data: bytes, sha256: str, uri: str, sources: bool) -> SpanManifest:
    parsed = parse_json(data, uri)
    manifest = SpanManifest.check({**parsed, "sources": []} if not sources and isinstance(parsed, dict) else parsed,
                                  uri)
    manifest._sha256 = sha256
    return manifest
