"""The Beam half of ingest: staged source lists in, rolling shard files and dead letters out.

    ListChunks -> ReadSources -> Normalize -> WriteShards       (rolling files per bundle)
                                   │  (+ near-copies of published images join their split: near_copies.py)
                                   │              └─ Signatures (one small JSON line per record, rolling files)
                                   └─ DeadLetter               (tagged: the reason a source is no record)
    all -> the staging folder, for the driver (beam_jobs/ingest.py) to check and publish

The staged lists are what the job spreads over its workers (Create reshuffles them), each read as it is
converted: the sources themselves are never shuffled, which on DirectRunner holds every one of them in the
driver's memory at once (some 4 KB a source), and the lists are small enough (beam_jobs/job.py CHUNK) to keep
every worker busy.

Each record's signature (SHA-256 of the source bytes, dHash of the picture and of its mirror, grey
mean and std, size, label, split, its quality issues, the published near-copy it follows, and the
staged file and position its record went to) is computed from the bytes and the
decode that Normalize does anyway: duplicates, the content index and the statistics need no second
pass over the images.
"""
from __future__ import annotations

import json
import uuid
from collections import deque

import apache_beam as beam
import fsspec
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import shared
from apache_beam.utils.windowed_value import WindowedValue

from beam_jobs import image_pool, progress
from beam_jobs.debris import STAGED_DEAD_LETTERS, STAGED_SHARDS, STAGED_SIGNATURES
from beam_jobs.near_lookup import Published
from beam_jobs.records import MB, Conversion, Converter
from beam_jobs.shards import RollingShards
from components.common.files import join, write_json, write_text
from components.contracts.config import IngestConfig

SIGNATURES = "signatures"  # WriteShards' tagged output
SIGNATURES_PER_FILE = 10_000  # lines a signature file holds (some 8 MB): what a bundle keeps in memory
DEAD = "dead"  # Normalize's tagged output: dead letters

IMAGES = Metrics.counter("ingest", "images")
BYTES_READ = Metrics.counter("ingest", "bytes_read")
DEAD_LETTERS = Metrics.counter("ingest", "dead_letters")


class Normalize(beam.DoFn):
    """Each source to a record (main output) or a dead letter (tagged DEAD): converted here, with the
    published records' dHash index loaded once per process (Beam's Shared), or with `processes`, in
    batches on beam_jobs/image_pool.py's worker processes, a few batches in flight, in order (sources the
    pool converted ahead, while Beam started, are taken as they come). Each source converted is counted for
    the driver's progress line, under the name of its `job` (beam_jobs/progress.py)."""

    def __init__(self, conversion: Conversion, processes: int = 0, job: str = ""):
        self.conversion, self.processes, self.job = conversion, processes, job
        self._shared = shared.Shared()

    def setup(self):
        if self.processes:
            self.pool = image_pool.pool(self.processes, self.conversion)
            return
        uri, bits = self.conversion.published, self.conversion.near.bits
        published = self._shared.acquire(lambda: Published(uri, bits), tag=f"{uri}:{bits}") if uri else None
        self.convert = Converter(self.conversion, published)

    def start_bundle(self):
        self.waiting, self.pending = [], deque()

    def process(self, source):
        if not self.processes:
            yield from self._outputs(source, *self.convert(source))
            return
        ahead = self.pool.claim(source)
        if ahead is not None:
            self.pending.append(([source], ahead))
        else:
            self.waiting.append(source)
            if len(self.waiting) == image_pool.BATCH:
                self._submit()
        while len(self.pending) > 2 * self.processes:
            yield from self._take()

    def finish_bundle(self):
        if self.waiting:
            self._submit()
        while self.pending:
            yield from map(_in_window, self._take())

    def _submit(self):
        self.pending.append((self.waiting, self.pool.submit(self.waiting)))
        self.waiting = []

    def _take(self):
        sources, converted = self.pending.popleft()
        for source, (record, reason) in zip(sources, converted.result()):
            yield from self._outputs(source, record, reason)

    def _outputs(self, source: dict, record, reason: str | None):
        progress.converted(self.job, source["size"])
        if record is None:
            DEAD_LETTERS.inc()
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(source, reason))
        else:
            IMAGES.inc()
            BYTES_READ.inc(source["size"])
            yield record


def _in_window(output):
    """An output of finish_bundle, in the global window it would have had from process."""
    if isinstance(output, beam.pvalue.TaggedOutput):
        return beam.pvalue.TaggedOutput(output.tag, _windowed(output.value))
    return _windowed(output)


def dead_letter(source: dict, reason: str) -> dict:
    return {"uri": source["uri"], "reason": reason, "size": source["size"], "version": source["version"]}


class WriteShards(beam.DoFn):
    """Streams records (each as the unit its file holds, made by the conversion) into rolling per-split
    files and emits a description of each file; with signatures, also writes each record's signature with
    the file and position of its record into JSON-lines files of SIGNATURES_PER_FILE lines (a bundle of
    DirectRunner is half an arrival: held whole, its signatures grew the driver by 0.9 KB a record), and
    emits their names (tagged SIGNATURES). Through fsspec, as the shards are: Beam's own file sinks cannot
    reach every store fsspec can."""

    def __init__(self, folder: str, max_bytes: int, compression: str):
        self.folder, self.max_bytes, self.compression = folder, max_bytes, compression

    def start_bundle(self):
        self.shards = RollingShards(self.folder, self.max_bytes, self.compression)
        self.signatures = []

    def process(self, record):
        split, unit, *signature = record
        closed = self.shards.add(split, unit)
        if closed:
            yield closed
        if signature:
            file, index = self.shards.position(split)
            self.signatures.append(json.dumps({**signature[0], "file": file, "index": index}) + "\n")
            if len(self.signatures) == SIGNATURES_PER_FILE:
                yield beam.pvalue.TaggedOutput(SIGNATURES, self._write_signatures())

    def finish_bundle(self):
        for closed in self.shards.close():
            yield _windowed(closed)
        if self.signatures:
            yield beam.pvalue.TaggedOutput(SIGNATURES, _windowed(self._write_signatures()))

    def _write_signatures(self) -> str:
        uri = join(self.folder, f"signatures-{uuid.uuid4().hex}.jsonl")
        write_text(uri, "".join(self.signatures))
        self.signatures = []
        return uri


def _windowed(value) -> WindowedValue:
    return WindowedValue(value, GlobalWindow().max_timestamp(), [GlobalWindow()])


class Gather(beam.PTransform):
    """Writes a whole (small) PCollection as one JSON list: only committed bundles reach it."""

    def __init__(self, uri: str):
        super().__init__()
        self.uri = uri

    def expand(self, items):
        return items | "ToList" >> beam.combiners.ToList() | "Write" >> beam.Map(_write_list, self.uri)


def build(pipeline, chunks: list[str], staging: str, config: IngestConfig, conversion: Conversion,
          processes: int = 0) -> None:
    sources = (
        pipeline
        | "ListChunks" >> beam.Create(chunks)
        | "ReadSources" >> beam.FlatMap(_read_json_lines)
    )
    normalize = Normalize(conversion, processes, staging)
    normalized = sources | "Normalize" >> beam.ParDo(normalize).with_outputs(DEAD, main="good")
    good, bad = normalized.good, normalized[DEAD]
    max_bytes = int(config.shard_mb * MB)
    written = good | "WriteShards" >> beam.ParDo(WriteShards(staging, max_bytes, config.compression)).with_outputs(
        SIGNATURES, main="shards")
    _ = written.shards | "GatherShards" >> Gather(join(staging, STAGED_SHARDS))
    _ = written[SIGNATURES] | "GatherSignatures" >> Gather(join(staging, STAGED_SIGNATURES))
    _ = bad | "GatherDeadLetters" >> Gather(join(staging, STAGED_DEAD_LETTERS))


def _write_list(items: list, uri: str) -> None:
    write_json(uri, items)


def _read_json_lines(uri: str):
    with fsspec.open(uri, mode="r") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
