"""Near-copies follow their original: a new image within a few bits of dHash of a published image, or
of another image of the same arrival (re-encoded, resized, lightly cropped, EXIF-rotated, mirrored),
joins that image's split, so eval never scores a picture training has seen in another file.

    driver, before the job: every published record's dHash and split, from the spans' content
            indexes (checked, rebuilt where broken: components/common/trusted_index.py), staged as one file
    Beam, in Normalize:     each new image looks its dHash and its mirror's up in a banded index of
            them (beam_jobs/near_lookup.py) and is written straight into its original's split, unless
            more than CROWD are as near: dHash cannot say which, and it keeps its own (so does each, back
            in the driver, when more than CROWD distinct pictures of the arrival followed one)
    driver, after the job:  images of the same arrival can only be compared once all are signed: each,
            in URI order, follows the nearest earlier one that is a copy of none; an original followed
            by more than CROWD is a crowd of pictures alike at 9x8, whose members are judged again by
            their block colours; a record that changes split is moved between staged shards
            (beam_jobs/shards.py), the one copy the job pays for it

With `ingest.near_copies set_aside` they become dead letters `near-copy of <uri> ...` instead (copies,
not bad files); with `report` they are only counted. A split a manifest gives is never changed.
Images with a shorter side under `ingest.near_copy_min_side` are never called near-copies: a 9x8
thumbnail of an 8x8 picture says nothing (docs/benchmarks.md#near-copies measures where it stops).
"""
from __future__ import annotations

import base64
import collections
import io
import json
import math
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import chain

import fsspec
import numpy as np

from beam_jobs.near_lookup import CROWD, NearRules, load_staged
from components.common.files import join
from components.common.near_index import bands
from components.common.signatures import BLOCKS
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
    pictures: list[list[dict]] = field(default_factory=list)  # signatures judged one picture, groups of two or more


def arrange(kept: list[dict], rules: NearRules, published: str | None) -> Arrangement:
    """Settles the arrival's near-copies among themselves, after the job, in URI order; updates the
    kept signatures' splits and returns what moved, what is set aside and the summary's count."""
    records = sorted(kept, key=lambda s: s["uri"])
    undone = _published_crowds(records, rules.bits)
    usable = [rules.eligible(s["width"], s["height"]) for s in records]
    found = _leaders(records, usable, rules.bits)
    crowds = _judge_crowds(records, found, rules.bits)
    crowded = crowds | {i for i, s in enumerate(records) if s.get("crowded")}
    names, result, found_copies, examples = _Names(published), Arrangement(moved=undone), 0, []
    result.pictures = [[records[i] for i in rows] for rows in _pictures(records, found, crowds, rules.bits)]
    for record, leader in zip(records, found):
        other, near = _original(record, records, leader, names)
        if other is not None:
            _act(record, other, near, rules, result)
            found_copies += 1
            if len(examples) < EXAMPLES:  # the summary's few: a model each for thousands would cost tenths of a second
                examples.append(NearPair(uri=record["uri"], split=record["split"], other_uri=other["uri"],
                                         other_split=other["split"], other_span=other["span"],
                                         distance=near["distance"], mirrored=near["mirrored"]))
    tally = result.tally
    result.report = NearDuplicates(count=found_copies, examples=examples, moved=tally["moved"],
                                   set_aside=tally["set_aside"], across=tally["across"], crowded=len(crowded),
                                   warning=_skewed(records, found_copies, tally["moved"], rules.eval_fraction))
    return result


def _leaders(records: list[dict], usable: list[bool], bits: int) -> list[tuple[int, int, bool] | None]:
    """By dHash: each record's nearest earlier original within `bits`, for its picture or its mirror image
    (row, bits apart, mirrored; the lowest row of equals, the mirror only when nearer), or None.

    Only an image that is a copy of none is an original for those after it (Hartigan's leader
    algorithm, "Clustering Algorithms", 1975, ch. 3): were copies originals too, a chain of alike
    pictures, each a few bits from the next, would carry one split across all of them (single
    linkage's chaining: 1,780 of the 1,797 demo digits followed 17 of them, and eval kept 3). So only
    originals are indexed (by band, near_index.py's multi-index hashing): however alike an arrival, each
    image looks at the few originals that share a band with it, never at every image before it (6,000
    pictures alike at 9x8 made 18 million pairs, 2 GB)."""
    spans = [(shift, (1 << width) - 1) for shift, width in bands(bits)]
    tables: list[dict[int, list[int]]] = [{} for _ in spans]
    hashes = np.array([int(s["dhash"], 16) for s in records], dtype=np.uint64)
    found: list[tuple[int, int, bool] | None] = [None] * len(records)
    for i, record in enumerate(records):
        if not usable[i] or record.get("near"):
            continue  # too small to judge, or a copy of a published image: never an original
        picture = int(record["dhash"], 16)
        best = None  # (bits apart, row, mirrored)
        for value, mirrored in ((picture, False), (int(record.get("mirror") or record["dhash"], 16), True)):
            seen = [rows for (shift, mask), table in zip(spans, tables) if (rows := table.get((value >> shift) & mask))]
            if seen:
                rows = np.fromiter(chain.from_iterable(seen), np.int64)
                apart = np.bitwise_count(hashes[rows] ^ np.uint64(value)).astype(np.int64)
                nearest = int(np.argmin(apart * len(records) + rows))
                if apart[nearest] <= bits and (best is None or apart[nearest] < best[0]):
                    best = (int(apart[nearest]), int(rows[nearest]), mirrored)
        if best is None:
            for (shift, mask), table in zip(spans, tables):
                table.setdefault((picture >> shift) & mask, []).append(i)
        else:
            found[i] = (best[1], best[0], best[2])
    return found


# Two copies of a picture differ in their block colours (components/common/signatures.py) by less than
# BLOCK_RMS grey levels, root mean square over the 192 values (PSNR 36 dB at 8x8): a re-encode's error is
# fine grain that a block of a 64 px thumbnail averages away (0.3-1.6 levels at JPEG quality 40), a halving, an
# EXIF turn or a mirror image (compared flipped) move a block by a few levels at edges (at most 3.6 in
# tests/beam_jobs/test_near_copies.py). Two frames of one camera differ where the scene changed: a block
# (1/64 of the picture) changed by 32 levels alone gives 32 / sqrt(64) = 4. A light crop moves the grid:
# inside a crowd only the crops that change the blocks less are still found (docs/ingest.md#near-copies).
BLOCK_RMS = 4.0
WINDOW = 32  # originals of a crowd an image is compared with, on each side of its mean colour


def _judge_crowds(records: list[dict], found: list, bits: int) -> set[int]:
    """An original with more than CROWD near-copies in the arrival heads a crowd of pictures alike at 9x8,
    not a picture's re-uploads: its members are judged again, in URI order, by block colours. Each follows
    the nearest earlier member that is a copy of none and lies within BLOCK_RMS (and `bits`); one that
    follows none is a distinct picture and keeps its own split. Returns the crowds' rows."""
    groups: dict[int, list[int]] = collections.defaultdict(list)
    for i, leader in enumerate(found):
        if leader is not None:
            groups[leader[0]].append(i)
    crowded: set[int] = set()
    for original, copies in groups.items():
        if len(copies) > CROWD:
            members = [original, *copies]  # in URI order: an original comes before its copies
            crowded.update(members)
            _judge_crowd(records, found, members, bits)
    return crowded


def _judge_crowd(records: list[dict], found: list, members: list[int], bits: int) -> None:
    colours = np.stack([np.frombuffer(base64.b64decode(records[i]["blocks"]), np.uint8) for i in members])
    colours = colours.astype(np.float32)  # sums of squares are integers below 2^24 (255^2 x 192): exact
    flipped = colours.reshape(len(members), BLOCKS, BLOCKS, 3)[:, :, ::-1].reshape(len(members), -1)
    norms = (colours * colours).sum(axis=1)  # a mirror image's too: flipping moves the blocks, not their colours
    hashes = np.array([[int(records[i]["dhash"], 16), int(records[i].get("mirror") or records[i]["dhash"], 16)]
                       for i in members], dtype=np.uint64)
    means, limit = colours.mean(axis=1).tolist(), BLOCK_RMS ** 2 * colours.shape[1]
    # The crowd's originals by mean colour: two within BLOCK_RMS have means within it too (|mean(a - b)| is at
    # most its root mean square), so only a window of them is compared, the nearest WINDOW on each side.
    keys, rows = [means[0]], [0]
    for k in range(1, len(members)):
        at = bisect_left(keys, means[k])
        low, high = bisect_left(keys, means[k] - BLOCK_RMS, 0, at), bisect_right(keys, means[k] + BLOCK_RMS, at)
        near = np.array(rows[max(low, at - WINDOW):min(high, at + WINDOW)], dtype=np.int64)
        if len(near):  # squared distances to the picture and to its mirror image, one column each
            squares = norms[near, None] + norms[k] - 2 * colours[near] @ np.stack((colours[k], flipped[k]), axis=1)
            apart = np.bitwise_count(hashes[near, :1] ^ hashes[k]).astype(np.int64)
            squares[apart > bits] = np.inf
            j, mirrored = np.unravel_index(np.argmin(squares), squares.shape)
            if squares[j, mirrored] <= limit:
                found[members[k]] = (members[int(near[j])], int(apart[j, mirrored]), bool(mirrored))
                continue
        found[members[k]] = None
        at = bisect_right(keys, means[k])
        keys.insert(at, means[k])
        rows.insert(at, k)


def _published_crowds(records: list[dict], bits: int) -> list[dict]:
    """Images the job sent after one published picture are no copies of it when more than CROWD distinct pictures
    (by block colours, judged among themselves) follow it: the published one is one of a crowd of pictures alike
    at 9x8 that dHash cannot name an original among, as when more than CROWD published ones are as near
    (near_lookup.py). Each takes back its own split and is judged with the arrival's own. Returns those whose split
    changed back, for their record to move: the job wrote it into the published picture's split."""
    following: dict[int, list[int]] = collections.defaultdict(list)
    for i, record in enumerate(records):
        if record.get("near"):
            following[record["near"]["row"]].append(i)
    undone = []
    for rows in following.values():
        if len(rows) <= CROWD:
            continue
        judged: dict[int, tuple | None] = {}
        _judge_crowd(records, judged, rows, bits)
        if 1 + sum(judged[i] is None for i in rows[1:]) <= CROWD:
            continue  # a few pictures come back many times: a stuck camera's frames are copies of the published one
        for i in rows:
            near = records[i].pop("near")
            records[i]["crowded"] = True
            if near["moved"]:
                records[i]["split"] = next(split for split in SPLITS if split != near["split"])
                undone.append(records[i])
    return undone


def _pictures(records: list[dict], found: list, crowds: set[int], bits: int) -> list[list[int]]:
    """Rows of the arrival that are one picture, in groups of two or more: an original and the near-copies that
    follow it whose block colours agree too. A crowd's members were judged so already; the few copies of a picture
    dHash alone judged are judged here again, and so are the images that follow one published picture (which
    keeps no block colours), among themselves. What follows only decides a split: a light crop that dHash finds
    and the block grid does not is still followed, and here counts as a picture of its own."""
    judged, groups = list(found), collections.defaultdict(list)
    for i, (record, leader) in enumerate(zip(records, found)):
        if leader is not None:
            groups[leader[0]].append(i)
        elif record.get("near"):  # keyed apart from the arrival's rows: a published row is no row of `records`
            groups[("published", record["near"]["row"])].append(i)
    for key, rows in groups.items():
        members = rows if isinstance(key, tuple) else [key, *rows]
        if len(members) > 1 and members[0] not in crowds:
            judged[members[0]] = None
            _judge_crowd(records, judged, members, bits)
    pictures = collections.defaultdict(list)
    for i, leader in enumerate(judged):
        if leader is not None:
            pictures[leader[0]].append(i)
    return [[original, *rows] for original, rows in sorted(pictures.items())]


SKEW_P = 1e-3


def _skewed(records: list[dict], found: int, moved: int, eval_fraction: float) -> str | None:
    """A warning when following near-copies left an eval share the path hash alone would not give. Each
    path's split is a uniform hash, so without moves the hashed records' eval count is Binomial(n,
    eval_fraction): an exact two-sided binomial test below SKEW_P says the moves made it. Crowds of alike
    pictures are judged by their block colours, so what is left is many copies of a few pictures (or
    small groups of pictures alike at 9x8 that dHash alone judged): the gate judges on what is left of eval."""
    hashed = [r for r in records if not r.get("fixed")]
    if not moved or not hashed or not 0 < eval_fraction < 1:
        return None
    held = sum(r["split"] == "eval" for r in hashed)
    p = binomial_p(held, len(hashed), eval_fraction)
    if p >= SKEW_P:
        return None
    return (f"following near-copies left eval {held} of {len(hashed)} new images ({held / len(hashed):.1%}; "
            f"ingest.eval_fraction {eval_fraction:g}, binomial p = {p:.1g}): {found} of them are near-copies of "
            f"another image and {moved} moved into its split, so the gate judges on the rest. If they are "
            f"distinct pictures, set ingest.near_copies report to keep each image's own split "
            f"(docs/ingest.md#near-copies)")


def binomial_p(k: int, n: int, p: float) -> float:
    """The two-sided exact binomial test's p-value as scipy.stats.binomtest gives it: the probability of
    every count no likelier than k (within a relative 1e-7), under Binomial(n, p). In numpy, since
    importing scipy.stats costs the driver half a second or more of every ingest."""
    j = np.arange(1, n + 1, dtype=np.float64)
    log_choose = np.concatenate(([0.0], np.cumsum(np.log(n - j + 1) - np.log(j))))
    log_pmf = log_choose + np.arange(n + 1) * math.log(p) + (n - np.arange(n + 1)) * math.log1p(-p)
    return min(1.0, float(np.exp(log_pmf[log_pmf <= log_pmf[k] + math.log1p(1e-7)]).sum()))


def _original(record: dict, records: list[dict], leader, names):
    """The image this record is a near-copy of, and how near: the published one the job found, else its
    original in the arrival; (None, None) when there is none."""
    near = record.get("near")
    if near:
        return {"uri": names.uri(near["row"]), "split": near["split"], "span": names.span(near["row"])}, near
    if leader is None:
        return None, None
    row, apart, mirrored = leader
    return {"uri": records[row]["uri"], "split": records[row]["split"], "span": None}, {"distance": apart, "mirrored": mirrored}


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
