"""Near-copies follow their original: a new image within a few bits of dHash of a published image, or
of another image of the same arrival (re-encoded, resized, lightly cropped, EXIF-rotated, mirrored),
joins that image's split, so eval never scores a picture training has seen in another file.

    driver, before the job: every published record's dHash and split, from the spans' content
            indexes (checked, rebuilt where broken: components/common/trusted_index.py), staged as one file
    Beam, in Normalize:     each new image looks its dHash and its mirror's up in a banded index of
            them (beam_jobs/near_lookup.py) and is written straight into its original's split
    driver, after the job:  images of the same arrival can only be compared once all are signed: each,
            in URI order, follows the nearest earlier one that is a copy of none; a record that changes
            split is moved between staged shards (beam_jobs/shards.py), the one copy the job pays for it

With `ingest.near_copies set_aside` they become dead letters `near-copy of <uri> ...` instead (copies,
not bad files); with `report` they are only counted. A split a manifest gives is never changed.
Images with a shorter side under `ingest.near_copy_min_side` are never called near-copies: a 9x8
thumbnail of an 8x8 picture says nothing (docs/benchmarks.md#near-copies measures where it stops).
"""
from __future__ import annotations

import io
import json
import math
from array import array
from dataclasses import dataclass, field

import fsspec
import numpy as np

from beam_jobs.near_lookup import NearRules, load_staged
from components.common.files import join
from components.common.near_index import BandedIndex, as_numbers
from components.common.spans import Spans
from components.common.trusted_index import verified
from components.contracts.layout import Root
from components.contracts.schema import SPLITS
from components.contracts.summaries import NearDuplicates, NearPair

STAGED_PUBLISHED = "near-published.npz"
EXAMPLES = 5


def stage_published(root: Root, staging: str) -> str | None:
    """Every published record's dHash, split, span and URI as one .npz in the staging folder; None
    when nothing is published. About 21 bytes a record plus its URI, in compact arrays."""
    hashes, splits, spans, offsets, uris = verified(root, lambda lines: _collect(root, lines))
    if not hashes:
        return None
    buffer = io.BytesIO()
    np.savez(buffer, hashes=np.frombuffer(hashes, np.uint64), splits=np.frombuffer(splits, np.uint8),
             spans=np.frombuffer(spans, np.uint32), offsets=np.frombuffer(offsets, np.uint64),
             uris=np.frombuffer(bytes(uris), np.uint8))
    uri = join(staging, STAGED_PUBLISHED)
    with fsspec.open(uri, "wb") as f:
        f.write(buffer.getvalue())
    return uri


def _collect(root: Root, lines):
    hashes, splits, spans, offsets, uris = array("Q"), bytearray(), array("I"), array("Q", [0]), bytearray()
    for number in Spans(root).published():
        for line in lines(number):
            _, dhash, split, _, uri = line.split("\t", 4)
            hashes.append(int(dhash, 16))
            splits.append(SPLITS.index(split))
            spans.append(number)
            uris += json.loads(uri).encode("utf-8", "surrogateescape")
            offsets.append(len(uris))
    return hashes, splits, spans, offsets, uris


@dataclass
class Arrangement:
    moved: list[dict] = field(default_factory=list)  # signatures whose split the driver changed (already updated)
    dropped: list[tuple[dict, str]] = field(default_factory=list)  # (signature, dead-letter reason)
    report: NearDuplicates = field(default_factory=lambda: NearDuplicates(count=0, examples=[]))
    tally: dict[str, int] = field(default_factory=lambda: {"moved": 0, "set_aside": 0, "across": 0})


def arrange(kept: list[dict], rules: NearRules, published: str | None) -> Arrangement:
    """Settles the arrival's near-copies among themselves, after the job, in URI order; updates the
    kept signatures' splits and returns what moved, what is set aside and the summary's count."""
    records = sorted(kept, key=lambda s: s["uri"])
    usable = np.array([rules.eligible(s["width"], s["height"]) for s in records], dtype=bool)
    index = BandedIndex(as_numbers([s["dhash"] for s in records]), rules.bits, usable)
    names, result, found_copies, examples = _Names(published), Arrangement(), 0, []
    # Every record's candidates, for its picture and its mirror image, found for all records at once:
    # the loop below, which must go in URI order, only picks among them, and only among the records before
    # it (no later one is an original yet), so the others are never sorted or scanned.
    mirrors = [s.get("mirror") or s["dhash"] for s in records]
    earlier = np.arange(len(records))
    candidates = index.pairs(np.concatenate([index.hashes, as_numbers(mirrors)]), before=np.concatenate([earlier, earlier]))
    originals = [False] * len(records)  # read once per candidate below: a list answers faster than an array
    for i, record in enumerate(records):
        found = (candidates.of(i), candidates.of(len(records) + i))
        other, near = _original(record, records, found, originals, names) if usable[i] else (None, None)
        if other is not None:
            _act(record, other, near, rules, result)
            found_copies += 1
            if len(examples) < EXAMPLES:  # the summary's few: a model each for thousands would cost tenths of a second
                examples.append(NearPair(uri=record["uri"], split=record["split"], other_uri=other["uri"],
                                         other_split=other["split"], other_span=other["span"],
                                         distance=near["distance"], mirrored=near["mirrored"]))
        # Only an image that is a copy of none is an original for those after it (Hartigan's leader
        # algorithm, "Clustering Algorithms", 1975, ch. 3): were copies originals too, a chain of alike
        # pictures, each a few bits from the next, would carry one split across all of them (single
        # linkage's chaining): 1,780 of the 1,797 demo digits followed 17 of them, and eval kept 3.
        originals[i] = usable[i] and other is None
    tally = result.tally
    result.report = NearDuplicates(count=found_copies, examples=examples, moved=tally["moved"],
                                   set_aside=tally["set_aside"], across=tally["across"],
                                   warning=_skewed(records, found_copies, tally["moved"], rules.eval_fraction))
    return result


SKEW_P = 1e-3


def _skewed(records: list[dict], found: int, moved: int, eval_fraction: float) -> str | None:
    """A warning when following near-copies left an eval share the path hash alone would not give. Each
    path's split is a uniform hash, so without moves the hashed records' eval count is Binomial(n,
    eval_fraction): an exact two-sided binomial test below SKEW_P says the moves made it; then the
    pictures are most likely alike to dHash without being copies."""
    hashed = [r for r in records if not r.get("fixed")]
    if not moved or not hashed or not 0 < eval_fraction < 1:
        return None
    held = sum(r["split"] == "eval" for r in hashed)
    p = binomial_p(held, len(hashed), eval_fraction)
    if p >= SKEW_P:
        return None
    return (f"following near-copies left eval {held} of {len(hashed)} new images ({held / len(hashed):.1%}; "
            f"ingest.eval_fraction {eval_fraction:g}, binomial p = {p:.1g}): {found} of them are within "
            f"dHash's reach of another image and {moved} moved. Pictures that are alike at 9x8 without being "
            f"copies (small, plain or centred ones) look like copies to dHash: if yours are distinct, set "
            f"ingest.near_copies report (docs/ingest.md#near-copies)")


def binomial_p(k: int, n: int, p: float) -> float:
    """The two-sided exact binomial test's p-value as scipy.stats.binomtest gives it: the probability of
    every count no likelier than k (within a relative 1e-7), under Binomial(n, p). In numpy, since
    importing scipy.stats costs the driver half a second or more of every ingest."""
    j = np.arange(1, n + 1, dtype=np.float64)
    log_choose = np.concatenate(([0.0], np.cumsum(np.log(n - j + 1) - np.log(j))))
    log_pmf = log_choose + np.arange(n + 1) * math.log(p) + (n - np.arange(n + 1)) * math.log1p(-p)
    return min(1.0, float(np.exp(log_pmf[log_pmf <= log_pmf[k] + math.log1p(1e-7)]).sum()))


def _original(record: dict, records: list[dict], found, originals: list[bool], names):
    """The image this record is a near-copy of, and how near: the published one the job found, else the
    nearest original of the arrival before it; (None, None) when there is none."""
    near = record.get("near")
    if near:
        return {"uri": names.uri(near["row"]), "split": near["split"], "span": names.span(near["row"])}, near
    j, apart, mirrored = _nearest(found, originals)
    if j is None:
        return None, None
    return {"uri": records[j]["uri"], "split": records[j]["split"], "span": None}, {"distance": apart, "mirrored": mirrored}


def _act(record: dict, other: dict, near: dict, rules: NearRules, result: Arrangement) -> None:
    tally = result.tally
    if rules.mode == "set_aside":
        where = "this span" if other["span"] is None else f"span {other['span']}"
        mirrored = ", mirrored" if near["mirrored"] else ""
        result.dropped.append((record, f"near-copy of {other['uri']} ({where}, split {other['split']}; dHash "
                                       f"{near['distance']} bits apart{mirrored})"))
        tally["set_aside"] += 1
    elif record["split"] != other["split"]:
        if rules.mode == "follow" and not record.get("fixed"):
            record["split"] = other["split"]
            result.moved.append(record)
            tally["moved"] += 1
        else:
            tally["across"] += 1
    elif record.get("near", {}).get("moved"):
        tally["moved"] += 1  # joined its original's split in the job already


def _nearest(found, originals: list[bool]):
    """(row, distance, mirrored) of the nearest original to this record or its mirror image (the lowest
    row of equals; the mirror's only when nearer): `found` holds each query's rows, nearest first."""
    best = (None, 65, False)
    for candidates, mirrored in zip(found, (False, True)):
        row, apart = next(((row, apart) for row, apart in candidates if originals[row]), (None, 65))
        if apart < best[1]:
            best = (row, apart, mirrored)
    return best


class _Names:
    """The URI and span of a published row, read from the staged file when first asked."""

    def __init__(self, uri: str | None):
        self.file, self.arrays = uri, None

    def _get(self):
        if self.arrays is None:
            arrays = load_staged(self.file)
            self.arrays = {key: arrays[key] for key in ("spans", "offsets", "uris")}
        return self.arrays

    def uri(self, row: int) -> str:
        arrays = self._get()
        start, end = int(arrays["offsets"][row]), int(arrays["offsets"][row + 1])
        return arrays["uris"][start:end].tobytes().decode("utf-8", "surrogateescape")

    def span(self, row: int) -> int:
        return int(self._get()["spans"][row])
