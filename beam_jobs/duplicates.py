"""Exact duplicates never cross splits; near-duplicates across splits are counted, not dropped.

A new record whose SHA-256 a published span already holds, or that another record of the same
arrival holds (the one with the smallest URI is kept), becomes a dead letter naming the copy.

Within the arrival, duplicates are grouped here in the driver, by sorting the staged signatures
(about 300 bytes a record, never the image bytes), rather than by a GroupByKey in Beam: the sort
also gives the sorted hashes the published lookup needs, and the driver must hold the arrival's
signatures anyway to write the content index and statistics. The price is driver memory in
proportion to the arrival (about 0.5 KB a record in Python: 0.5 GB for a million new images); a
GroupByKey would scale past that at the cost of a shuffle and a second output to merge.

Against published spans, each span's content index (sorted by SHA-256) streams once against the
arrival's sorted hashes: memory holds the arrival's signatures and the matches, never an index,
and no shard is read. The merge is only right on a sorted, whole index, so each is checked as it
streams (components/common/trusted_index.py): one missing (a span of 0.1) or damaged is rebuilt
from its span's shards, and the lookup starts again.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby

import fsspec

from beam_jobs.debris import STAGED_SIGNATURES
from beam_jobs.shards import prune
from components.common.content_index import parse
from components.common.files import join, read_json
from components.common.trusted_index import verified
from components.contracts.layout import Root
from components.contracts.results import LabelConflict
from components.contracts.summaries import NearDuplicates, NearPair

NEAR = 4  # dHash bits: within this, the same picture re-encoded, resized or lightly edited
# Pigeonhole: two 64-bit hashes within 4 bits agree exactly on at least one of 5 bands.
BANDS = ((0, 13), (13, 13), (26, 13), (39, 13), (52, 12))
EXAMPLES = 5


@dataclass
class Findings:
    kept: list[dict]  # signatures of the records to publish, sorted by SHA-256
    dropped: list[tuple[dict, str]]  # (signature, dead-letter reason)
    conflicts: list[LabelConflict] = field(default_factory=list)
    near: NearDuplicates | None = None


def find(signatures: list[dict], root: Root) -> Findings:
    """Sorts the arrival's signatures into kept and dropped, against every published span of ROOT."""
    ordered = sorted(signatures, key=lambda s: (s["sha256"], s["uri"]))
    hashes = sorted({s["sha256"] for s in ordered})
    return verified(root, lambda lines: _find(ordered, hashes, root.published(), lines))


def _find(ordered: list[dict], hashes: list[str], numbers: list[int], lines) -> Findings:
    near = _Near(ordered)
    published: dict[str, tuple[int, str]] = {}
    for number in numbers:
        _scan(number, lines(number), hashes, published, near)
    near.within()
    findings = _decide(ordered, published)
    findings.near = near.report({s["uri"] for s in findings.kept})
    return findings


def _scan(number: int, index: Iterator[str], hashes: list[str], published: dict, near: _Near) -> None:
    """One streaming merge of a span's sorted index against the arrival's sorted hashes."""
    pending = iter(hashes)
    current = next(pending, None)
    for line in index:
        sha = line[:64]
        while current is not None and current < sha:
            current = next(pending, None)
        if current == sha:
            published.setdefault(sha, (number, line))
        near.check(sha, line[65:81], line[82:87].rstrip("\t"), line, number)


def _decide(ordered: list[dict], published: dict) -> Findings:
    findings = Findings(kept=[], dropped=[])
    for sha, group in groupby(ordered, key=lambda s: s["sha256"]):
        copies = list(group)
        if sha in published:
            number, line = published[sha]
            _, _, split, label, uri = parse(line)
        else:
            first = copies.pop(0)
            findings.kept.append(first)
            number, split, label, uri = None, first["split"], first["label"], first["uri"]
        for copy in copies:
            where = "this span" if number is None else f"span {number}"
            reason = f"duplicate of {uri} ({where}, split {split})"
            if copy["label"] != label:
                reason += f" labelled {label}"
                findings.conflicts.append(LabelConflict(uri=copy["uri"], label=copy["label"], duplicate_of=uri,
                                                        other_label=label, other_span=number))
            findings.dropped.append((copy, reason))
    return findings


def _bands(value: int) -> list[tuple[int, int]]:
    return [(band, (value >> start) & ((1 << width) - 1)) for band, (start, width) in enumerate(BANDS)]


class _Near:
    """New records with a near-duplicate (dHash within NEAR bits, another SHA-256) in the other split.

    The arrival's hashes are bucketed by band; each published index line and each new record looks
    up its 5 bands. A record is flagged once, with its first pair as the example."""

    def __init__(self, records: list[dict]):
        self.records, self.values = records, [int(r["dhash"], 16) for r in records]
        self.buckets: dict[tuple[int, int], list[int]] = defaultdict(list)
        self.found: dict[int, NearPair] = {}
        for i, value in enumerate(self.values):
            for key in _bands(value):
                self.buckets[key].append(i)

    def check(self, sha: str, dhash: str, split: str, where, span: int | None) -> None:
        value = int(dhash, 16)
        for key in _bands(value):
            for i in self.buckets.get(key, ()):
                record = self.records[i]
                if i in self.found or record["split"] == split or record["sha256"] == sha:
                    continue
                apart = (self.values[i] ^ value).bit_count()
                if apart <= NEAR:
                    other = parse(where)[4] if isinstance(where, str) else where["uri"]
                    self.found[i] = NearPair(uri=record["uri"], split=record["split"], other_uri=other,
                                             other_split=split, other_span=span, distance=apart)

    def within(self) -> None:
        for record in self.records:
            self.check(record["sha256"], record["dhash"], record["split"], record, None)

    def report(self, kept: set[str]) -> NearDuplicates:
        pairs = [pair for pair in self.found.values() if pair.uri in kept]
        return NearDuplicates(count=len(pairs), examples=pairs[:EXAMPLES])


def settle(staging: str, shards: list[dict], fresh: list, root: Root,
           compression: str) -> tuple[list[dict], list[dict], Findings]:
    """After the Beam job: the staged shards without duplicates, the duplicates' dead letters, and
    what was found. `fresh` are the arrival's sources (for each dead letter's size and version)."""
    findings = find(read_signatures(staging), root)
    shards = prune(shards, [signature for signature, _ in findings.dropped], compression)
    by_uri = {source.uri: source for source in fresh}
    dead = [{"uri": s["uri"], "reason": reason, "size": by_uri[s["uri"]].size, "version": by_uri[s["uri"]].version}
            for s, reason in findings.dropped]
    return shards, dead, findings


def read_signatures(staging: str) -> list[dict]:
    """Every signature of the job's committed bundles (a retried bundle's files are not listed)."""
    found = []
    for uri in read_json(join(staging, STAGED_SIGNATURES)):
        with fsspec.open(uri, "rt", encoding="utf-8") as f:
            found += [json.loads(line) for line in f if line.strip()]
    return found
