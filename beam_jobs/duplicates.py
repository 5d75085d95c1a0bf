"""Exact duplicates never cross splits (and near-copies follow their original: beam_jobs/near_copies.py).

A new record whose SHA-256 a published span already holds, or that another record of the same
arrival holds (the one with the smallest URI is kept), becomes a dead letter naming the copy.

Within the arrival, duplicates are grouped here in the driver, by sorting the staged signatures
(about 300 bytes a record, never the image bytes), rather than by a GroupByKey in Beam: the sort
also gives the sorted hashes the published lookup needs, and the driver must hold the arrival's
signatures anyway to write the content index and statistics. The price is driver memory in
proportion to the arrival (about 2 KB a record in Python, a dict of some 16 values: 2 GB for a million
new images); a GroupByKey would scale past that at the cost of a shuffle and a second output to merge.

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
from beam_jobs.near_copies import arrange
from beam_jobs.near_lookup import NearRules
from beam_jobs.quality import Rules, settle_odd_sizes
from beam_jobs.shards import rearrange
from components.common.content_index import parse
from components.common.files import join, read_json
from components.common.spans import Spans
from components.common.trusted_index import verified
from components.contracts.layout import Root
from components.contracts.results import LabelConflict, SamePicture
from components.contracts.summaries import NearDuplicates

EXAMPLES = 5  # URIs of the largest group of one picture that the manifest names


@dataclass
class Findings:
    kept: list[dict]  # signatures of the records to publish, sorted by SHA-256
    dropped: list[tuple[dict, str]]  # (signature, dead-letter reason): copies, near-copies set aside, odd sizes
    conflicts: list[LabelConflict] = field(default_factory=list)
    near: NearDuplicates | None = None
    same_picture: SamePicture | None = None
    set_aside: list[tuple[dict, str]] = field(default_factory=list)  # (signature, reason): odd sizes set aside


def find(signatures: list[dict], root: Root) -> Findings:
    """Sorts the arrival's signatures into kept and dropped, against every published span of ROOT."""
    ordered = sorted(signatures, key=lambda s: (s["sha256"], s["uri"]))
    hashes = sorted({s["sha256"] for s in ordered})
    return verified(root, lambda lines: _find(ordered, hashes, Spans(root).published(), lines))


def _find(ordered: list[dict], hashes: list[str], numbers: list[int], lines) -> Findings:
    published: dict[str, tuple[int, str]] = {}
    for number in numbers:
        _scan(number, lines(number), hashes, published)
    return _decide(ordered, published)


def _scan(number: int, index: Iterator[str], hashes: list[str], published: dict) -> None:
    """One streaming merge of a span's sorted index against the arrival's sorted hashes."""
    pending = iter(hashes)
    current = next(pending, None)
    for line in index:
        sha = line[:64]
        while current is not None and current < sha:
            current = next(pending, None)
        if current == sha:
            published.setdefault(sha, (number, line))


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


def settle(staging: str, shards: list[dict], fresh: list, root: Root, config,
           published: str | None = None) -> tuple[list[dict], list[dict], Findings]:
    """After the Beam job: the staged shards without duplicates (exact, and near-copies set aside), with
    near-copies of the arrival moved into their original's split (beam_jobs/near_copies.py), the
    dead letters of what was kept out, and what was found. `fresh` are the arrival's sources (for
    each dead letter's size and version); `published` the staged dHashes of the published records."""
    findings = find(read_signatures(staging), root)
    arranged = arrange(findings.kept, NearRules.of(config), published)
    findings.same_picture = same_picture(findings.kept, arranged.pictures, findings.dropped)
    findings.near, findings.dropped = arranged.report, findings.dropped + arranged.dropped
    findings.kept = _without(findings.kept, arranged.dropped)
    findings.set_aside = settle_odd_sizes(findings.kept, Rules.of(config))
    findings.kept = _without(findings.kept, findings.set_aside)
    out = findings.dropped + findings.set_aside
    shards = rearrange(shards, [signature for signature, _ in out], arranged.moved, config.compression, staging,
                       int(config.shard_mb * 1024 * 1024))
    by_uri = {source.uri: source for source in fresh}
    dead = [{"uri": s["uri"], "reason": reason, "size": by_uri[s["uri"]].size, "version": by_uri[s["uri"]].version}
            for s, reason in out]
    return shards, dead, findings


def same_picture(kept: list[dict], pictures: list[list[dict]], copies: list[tuple[dict, str]]) -> SamePicture:
    """The largest group of the arrival's files that are one picture: a group of records near_copies.py judged
    one picture (`pictures`), or a record alone, each with the exact copies of it kept out (`copies`). A copy of a
    published image is no file of this span's pictures."""
    extra: dict[str, list[str]] = defaultdict(list)
    for copy, _ in copies:
        extra[copy["sha256"]].append(copy["uri"])

    def files(group: list[dict]) -> list[str]:
        return [uri for s in group for uri in (s["uri"], *extra.get(s["sha256"], ()))]

    grouped = {id(s) for group in pictures for s in group}
    alone = [[s] for s in kept if s["sha256"] in extra and id(s) not in grouped]
    largest = sorted(files(max(pictures + alone, key=lambda group: len(files(group)), default=kept[:1])))
    total = len(kept) + sum(len(extra.get(s["sha256"], ())) for s in kept)
    return SamePicture(count=len(largest), total=total, examples=largest[:EXAMPLES])


def _without(kept: list[dict], out: list[tuple[dict, str]]) -> list[dict]:
    gone = {id(signature) for signature, _ in out}
    return [signature for signature in kept if id(signature) not in gone]


# Values many signatures share: held once, not once a record (0.3 of the 2.3 KB a signature takes).
SHARED = ("label", "format", "split", "file")


def read_signatures(staging: str) -> list[dict]:
    """Every signature of the job's committed bundles (a retried bundle's files are not listed)."""
    found, values = [], {}
    for uri in read_json(join(staging, STAGED_SIGNATURES)):
        with fsspec.open(uri, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    signature = json.loads(line)
                    for key in SHARED:
                        signature[key] = values.setdefault(signature[key], signature[key])
                    found.append(signature)
    return found
