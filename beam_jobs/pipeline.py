"""The Beam half of ingest: staged source lists in, rolling shard files and dead letters out.

    ReadSources -> Spread -> Normalize -> WriteShards       (rolling files per bundle)
                                │  (+ near-copies of published images join their split: near_copies.py)
                                │              └─ Signatures (one small JSON line per record)
                                └─ DeadLetter               (with_exception_handling)
    all -> the staging folder, for the driver (beam_jobs/ingest.py) to check and publish

Each record's signature (SHA-256 of the source bytes, dHash of the picture and of its mirror, grey
mean and std, size, label, split, its quality issues, the published near-copy it follows, and the
staged file and position its record went to) is computed from the bytes and the
decode that Normalize does anyway: duplicates, the content index and the statistics need no second
pass over the images.
"""
from __future__ import annotations

import json
import uuid

import apache_beam as beam
import fsspec
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import shared
from apache_beam.utils.windowed_value import WindowedValue

from beam_jobs import quality
from beam_jobs.debris import STAGED_DEAD_LETTERS, STAGED_SHARDS, STAGED_SIGNATURES
from beam_jobs.local import NotRegularFile, open_source
from beam_jobs.near_copies import NearRules, Published
from beam_jobs.quality import Rules
from beam_jobs.shards import RollingShards
from components.common.files import join, write_json, write_text
from components.common.images import Limits, Rejected, normalize
from components.common.signatures import sha256
from components.contracts import schema
from components.contracts.run_config import IngestSettings

MB = 1024 * 1024
SIGNATURES = "signatures"  # WriteShards' tagged output

IMAGES = Metrics.counter("ingest", "images")
REENCODED = Metrics.counter("ingest", "reencoded")
BYTES_READ = Metrics.counter("ingest", "bytes_read")
DEAD_LETTERS = Metrics.counter("ingest", "dead_letters")


def to_example(source: dict, limits: Limits | None = None, rules: Rules | None = None, near: NearRules | None = None,
               published: Published | None = None) -> tuple[str, bytes, dict]:
    """Reads, verifies and normalizes one source into (split, serialized tf.Example, signature): the
    split is its original's when it is a near-copy of a published image that it may follow."""
    limits, rules, near = limits or Limits(), rules or Rules(), near or NearRules()
    data = read_source(source, limits.max_bytes)
    image = normalize(data, limits.max_side, limits.max_pixels)
    if limits.blank_std and image.pixels.std < limits.blank_std:
        raise Rejected(f"blank image: std {image.pixels.std:.1f} of 0-255 grey, below --blank-std {limits.blank_std:g}")
    found = quality.issues(image.pixels.quality.as_dict(), image.width, image.height, rules)
    aside = sorted(rules.set_aside & found.keys())
    if aside:
        raise Rejected(quality.reason(aside[0], found[aside[0]]))
    IMAGES.inc()
    BYTES_READ.inc(len(data))
    if image.reencoded:
        REENCODED.inc()
    split, fixed = source["split"], bool(source.get("fixed"))
    signature = {
        "uri": source["uri"], "sha256": sha256(data), "dhash": image.pixels.dhash, "mirror": image.pixels.mirror,
        "mean": image.pixels.mean, "std": image.pixels.std, "label": source["label"], "format": image.format,
        "width": image.width, "height": image.height, "bytes": len(image.encoded),
    }
    match = published.match(image.pixels.dhash, image.pixels.mirror) if published and near.eligible(
        image.width, image.height) else None
    if match:
        match["moved"] = near.mode == "follow" and not fixed and match["split"] != split
        split = match["split"] if match["moved"] else split
        signature["near"] = match
    signature.update({"split": split, **({"fixed": True} if fixed else {}), **({"issues": sorted(found)} if found else {})})
    return split, schema.encode_example(
        encoded=image.encoded, image_format=image.format, height=image.height, width=image.width,
        label=source["label_id"], text=source["label"], source=source["uri"],
    ), signature


class Normalize(beam.DoFn):
    """to_example, with the published records' dHash index loaded once per worker process (Beam's
    Shared): every thread of a process looks up the same one."""

    def __init__(self, limits: Limits, rules: Rules, near: NearRules, published: str | None):
        self.limits, self.rules, self.near, self.published_uri = limits, rules, near, published
        self._shared = shared.Shared()

    def setup(self):
        uri, bits = self.published_uri, self.near.bits
        self.published = self._shared.acquire(lambda: Published(uri, bits), tag=f"{uri}:{bits}") if uri else None

    def process(self, source):
        yield to_example(source, self.limits, self.rules, self.near, self.published)


def read_source(source: dict, max_bytes: int | None) -> bytes:
    """The file's bytes. A file listed larger than `max_bytes` is never opened, and no more than
    that is read of one that grew after it was listed."""
    if max_bytes and source["size"] > max_bytes:
        raise Rejected(_too_large(source["size"], max_bytes))
    try:
        with open_source(source["uri"]) as f:
            data = f.read(max_bytes + 1 if max_bytes else -1)
    except FileNotFoundError:
        raise Rejected("not found: removed after it was listed") from None
    except NotRegularFile as error:
        raise Rejected(str(error)) from None
    if max_bytes and len(data) > max_bytes:
        raise Rejected(_too_large(len(data), max_bytes))
    return data


def _too_large(size: int, max_bytes: int) -> str:
    return f"file too large: {size / MB:,.1f} MB, more than the limit of {max_bytes / MB:g} MB (--max-file-mb)"


def dead_letter(failure) -> dict:
    source, (_, reason, _) = failure
    DEAD_LETTERS.inc()
    return {"uri": source["uri"], "reason": reason, "size": source["size"], "version": source["version"]}


class WriteShards(beam.DoFn):
    """Streams records into rolling per-split files and emits a description of each file; with
    signatures, also writes one JSON-lines file per bundle of each record's signature with the file
    and position of its record, and emits its name (tagged SIGNATURES). Through fsspec, as the
    shards are: Beam's own file sinks cannot reach every store fsspec can."""

    def __init__(self, folder: str, max_bytes: int, compression: str):
        self.folder, self.max_bytes, self.compression = folder, max_bytes, compression

    def start_bundle(self):
        self.shards = RollingShards(self.folder, self.max_bytes, self.compression)
        self.signatures = []

    def process(self, record):
        split, example, *signature = record
        closed = self.shards.write(split, example)
        if closed:
            yield closed
        if signature:
            file, index = self.shards.position(split)
            self.signatures.append(json.dumps({**signature[0], "file": file, "index": index}) + "\n")

    def finish_bundle(self):
        for closed in self.shards.close():
            yield _windowed(closed)
        if self.signatures:
            uri = join(self.folder, f"signatures-{uuid.uuid4().hex}.jsonl")
            write_text(uri, "".join(self.signatures))
            yield beam.pvalue.TaggedOutput(SIGNATURES, _windowed(uri))


def _windowed(value) -> WindowedValue:
    return WindowedValue(value, GlobalWindow().max_timestamp(), [GlobalWindow()])


class Gather(beam.PTransform):
    """Writes a whole (small) PCollection as one JSON list: only committed bundles reach it."""

    def __init__(self, uri: str):
        super().__init__()
        self.uri = uri

    def expand(self, items):
        return items | "ToList" >> beam.combiners.ToList() | "Write" >> beam.Map(_write_list, self.uri)


def build(pipeline, chunks: list[str], staging: str, config: IngestSettings, published: str | None = None) -> None:
    sources = (
        pipeline
        | "ListChunks" >> beam.Create(chunks)
        | "ReadSources" >> beam.FlatMap(_read_json_lines)
        | "Spread" >> beam.Reshuffle()
    )
    limits = Limits(max_side=config.max_side, max_pixels=int(config.max_megapixels * 1e6),
                    max_bytes=int(config.max_file_mb * MB), blank_std=config.blank_std)
    normalize = Normalize(limits, Rules.of(config), NearRules.of(config), published)
    good, bad = sources | "Normalize" >> beam.ParDo(normalize).with_exception_handling(exc_class=Rejected)
    max_bytes = int(config.shard_mb * MB)
    written = good | "WriteShards" >> beam.ParDo(WriteShards(staging, max_bytes, config.compression)).with_outputs(
        SIGNATURES, main="shards")
    _ = written.shards | "GatherShards" >> Gather(join(staging, STAGED_SHARDS))
    _ = written[SIGNATURES] | "GatherSignatures" >> Gather(join(staging, STAGED_SIGNATURES))
    _ = bad | "DeadLetter" >> beam.Map(dead_letter) | "GatherDeadLetters" >> Gather(join(staging, STAGED_DEAD_LETTERS))


def _write_list(items: list, uri: str) -> None:
    write_json(uri, items)


def _read_json_lines(uri: str):
    with fsspec.open(uri, mode="r") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
