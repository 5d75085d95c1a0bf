"""The Beam half of ingest: staged source lists in, rolling shard files and dead letters out.

    ReadSources -> Spread -> Normalize -> WriteShards       (rolling files per bundle)
                                └─ DeadLetter               (with_exception_handling)
    both -> Gather into the staging folder, for the driver (beam_jobs/ingest.py) to publish
"""
from __future__ import annotations

import json

import apache_beam as beam
import fsspec
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from beam_jobs.images import Limits, Rejected, normalize
from beam_jobs.shards import RollingShards
from components.common.files import join, write_json
from components.contracts import schema
from components.contracts.config import IngestConfig

MB = 1024 * 1024
# What the job leaves in its staging folder for the driver, which reads them and publishes the span.
# Staging is the job's own business, so these names live here and not in the ROOT layout.
STAGED_SHARDS = "shards.json"
STAGED_DEAD_LETTERS = "dead.json"

IMAGES = Metrics.counter("ingest", "images")
REENCODED = Metrics.counter("ingest", "reencoded")
BYTES_READ = Metrics.counter("ingest", "bytes_read")
DEAD_LETTERS = Metrics.counter("ingest", "dead_letters")


def to_example(source: dict, limits: Limits | None = None) -> tuple[str, bytes]:
    """Reads, verifies and normalizes one source into (split, serialized tf.Example)."""
    limits = limits or Limits()
    data = read_source(source, limits.max_bytes)
    image = normalize(data, limits.max_side, limits.max_pixels)
    IMAGES.inc()
    BYTES_READ.inc(len(data))
    if image.reencoded:
        REENCODED.inc()
    return source["split"], schema.encode_example(
        encoded=image.encoded, image_format=image.format, height=image.height, width=image.width,
        label=source["label_id"], text=source["label"], source=source["uri"],
    )


def read_source(source: dict, max_bytes: int | None) -> bytes:
    """The file's bytes. A file listed larger than `max_bytes` is never opened, and no more than
    that is read of one that grew after it was listed."""
    if max_bytes and source["size"] > max_bytes:
        raise Rejected(_too_large(source["size"], max_bytes))
    try:
        with fsspec.open(source["uri"]) as f:
            data = f.read(max_bytes + 1 if max_bytes else -1)
    except FileNotFoundError:
        raise Rejected("not found: removed after it was listed") from None
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
    """Streams records into rolling per-split files and emits a description of each file."""

    def __init__(self, folder: str, max_bytes: int, compression: str):
        self.folder, self.max_bytes, self.compression = folder, max_bytes, compression

    def start_bundle(self):
        self.shards = RollingShards(self.folder, self.max_bytes, self.compression)

    def process(self, record):
        closed = self.shards.write(*record)
        if closed:
            yield closed

    def finish_bundle(self):
        for closed in self.shards.close():
            yield WindowedValue(closed, GlobalWindow().max_timestamp(), [GlobalWindow()])


class Gather(beam.PTransform):
    """Writes a whole (small) PCollection as one JSON list: only committed bundles reach it."""

    def __init__(self, uri: str):
        super().__init__()
        self.uri = uri

    def expand(self, items):
        return items | "ToList" >> beam.combiners.ToList() | "Write" >> beam.Map(_write_list, self.uri)


def build(pipeline, chunks: list[str], staging: str, config: IngestConfig) -> None:
    sources = (
        pipeline
        | "ListChunks" >> beam.Create(chunks)
        | "ReadSources" >> beam.FlatMap(_read_json_lines)
        | "Spread" >> beam.Reshuffle()
    )
    limits = Limits(max_side=config.max_side, max_pixels=int(config.max_megapixels * 1e6),
                    max_bytes=int(config.max_file_mb * MB))
    good, bad = sources | "Normalize" >> beam.Map(to_example, limits).with_exception_handling(
        exc_class=Rejected
    )
    max_bytes = int(config.shard_mb * MB)
    _ = (good | "WriteShards" >> beam.ParDo(WriteShards(staging, max_bytes, config.compression))
         | "GatherShards" >> Gather(join(staging, STAGED_SHARDS)))
    _ = bad | "DeadLetter" >> beam.Map(dead_letter) | "GatherDeadLetters" >> Gather(join(staging, STAGED_DEAD_LETTERS))


def _write_list(items: list, uri: str) -> None:
    write_json(uri, items)


def _read_json_lines(uri: str):
    with fsspec.open(uri, mode="r") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
