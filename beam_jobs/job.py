"""The Beam job as ingest's driver starts it: the new sources staged as lists, the image workers started
first, Beam loaded and its runner bounded (beam_jobs/bounded.py). The job itself: beam_jobs/ingest_pipeline.py."""
from __future__ import annotations

import gc
import itertools
import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

from beam_jobs import bounded
from beam_jobs.progress import Shown
from beam_jobs.sources import Source
from components.common.beam_runner import runner_for
from components.common.files import join, write_text
from components.common.program import os_error_line, unwritable
from components.contracts.config import IngestConfig
from components.contracts.summaries import Progress

# Sources per staged list file. The lists are what the job spreads over its workers (beam_jobs/ingest_pipeline.py):
# an arrival of a few thousand makes a few, enough for every worker; and their names keep the job graph small
# on any runner (10,000 for ten million sources).
CHUNK = 1_000


class JobFailed(Exception):
    """The Beam job failed; the message says how (its last line)."""


def stage_sources(staging: str, fresh: list[Source], labels: list[str]) -> list[str]:
    """The job's input: the sources' rows in files of CHUNK lines under `staging` (without their queries:
    the job's Conversion hands those to its workers); returns their URIs."""
    chunks = []
    for start in range(0, len(fresh), CHUNK):
        uri = join(staging, f"sources-{start // CHUNK:05d}.jsonl")
        write_text(uri, "".join(json.dumps(row) + "\n" for row in job_rows(fresh[start:start + CHUNK], labels)))
        chunks.append(uri)
    return chunks


def job_rows(fresh: list[Source], labels: list[str]) -> list[dict]:
    """The sources as the Beam job reads them from the staged lists."""
    index = {name: i for i, name in enumerate(labels)}
    return [{**s.as_dict(), "label_id": index[s.label]} for s in fresh]


def first_sources(fresh: list[Source], budget: int) -> list[Source]:
    """The first sources whose bytes fit in `budget` (at least one)."""
    fitting = itertools.takewhile(lambda total: total <= budget, itertools.accumulate(s.size for s in fresh))
    return fresh[:max(1, sum(1 for _ in fitting))]


def run_pipeline(chunks: list[str], staging: str, config: IngestConfig, pipeline_args: list[str],
                 published: str | None, fresh: list[Source], labels: list[str],
                 progress: Callable[[Progress], None] | None = None) -> None:
    """The Beam job over the staged source lists of the new sources `fresh` (named with `labels`); `progress`
    gets its progress events while it runs on this process's threads (beam_jobs/progress.py)."""
    from beam_jobs import image_pool
    from beam_jobs.records import Conversion

    processes = image_pool.processes_for(len(fresh), pipeline_args)
    on_threads = image_pool.on_threads(pipeline_args)
    shown = Shown(staging, sum(s.size for s in fresh), progress) if progress and on_threads else nullcontext()
    conversion = Conversion.of(config, published, tuple((s.uri, s.query) for s in fresh if s.query))
    stuck = False
    try:
        with shown:
            if processes:  # started first, its processes convert the first sources while Beam loads and starts the job
                pool = image_pool.pool(processes, conversion)
                pool.prefetch(job_rows(first_sources(fresh, image_pool.AHEAD_BYTES), labels))
            # Beam is imported here, not at the top: `stoke ingest --help` answers before it loads.
            with _long_lived(), _without_cloud_clients(on_threads):
                import apache_beam as beam

                from beam_jobs.ingest_pipeline import build

            _flushed_by_size()
            options = pipeline_options(pipeline_args)
            runner = runner_for(options)

            def job():
                with beam.Pipeline(runner=runner, options=options) as pipeline:
                    build(pipeline, chunks, staging, config, conversion, processes)

            bounded.run(job)
    except Exception as error:  # the runner wraps worker errors in its own types
        stuck = isinstance(error, bounded.StuckRunner)
        full = unwritable(error)  # a full disk: the file and the system's words, not the runner's wrapping
        said = os_error_line(full) if full else _last_line(error)
        raise JobFailed(f"the Beam job failed, nothing was published: {said} (STOKE_DEBUG=1 shows Beam's log)") from error
    finally:
        image_pool.shut_down(wait=not stuck)  # a stuck job's conversion may never end: leave it behind


@contextmanager
def _long_lived():
    """Loads what lives as long as the process (Beam: some 300,000 objects) without the collector: it
    would walk them again and again while they load, and then through the job (0.4 s each on a 6,000-image
    arrival, 2 cores). They stay out of its walks until the span is published (`ingest`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()


@contextmanager
def _without_cloud_clients(local: bool):
    """While Beam loads for a job on this process's threads, its `io` package skips the BigQuery, Pub/Sub and
    GCS clients it imports when apache-beam[gcp] is installed (0.4-0.7 s of CPU, while the image workers
    share the cores): such a job uses none of them, Stoke reads and writes through fsspec.
    apache_beam/io/__init__.py (Beam 2.77) imports them under `except ImportError`, which a None in
    sys.modules raises; it is taken out again at once, so a later import of them (another runner, a test)
    loads them as usual."""
    blocked = "apache_beam.io.gcp.bigquery"
    block = local and "apache_beam" not in sys.modules and blocked not in sys.modules
    if block:
        sys.modules[blocked] = None
    try:
        yield
    finally:
        if block and sys.modules.get(blocked, 0) is None:
            del sys.modules[blocked]


def _flushed_by_size() -> None:
    """DirectRunner hands elements from one stage to the next across Beam's data plane, in buffers that its
    workers and its data server also flush on a timer, every DATA_BUFFER_TIME_LIMIT_MS (1 s). That flush
    takes the buffer's bytes, sends them and then empties the buffer, with no lock against the thread writing
    into it (apache_beam/runners/worker/data_plane.py, TimeBasedBufferingClosableOutputStream, Beam 2.77):
    what a bundle writes meanwhile is dropped without an error, or cut, and then fails the decode. A bundle of
    minutes flushes hundreds of times: runs of hundreds of staged sources went missing from an arrival of
    150,000 files (tests/beam_jobs/test_ingest.py). At 0 the buffers are flushed by size and at each bundle's
    end, by the thread that writes them, as Beam's own SDK workers flush by default; a batch job waits on no
    timer. Read when the runner starts its workers, so set before each job; other runners never read it."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0


def pipeline_options(pipeline_args: list[str]):
    """Beam options as given; without a runner, DirectRunner with one worker thread per core (run on Beam's
    FnApiRunner: components/common/beam_runner.py).

    Threads, not DirectRunner's worker processes, which import all of Beam each and hand every element
    across gRPC: the conversion that holds the GIL goes to beam_jobs/image_pool.py's processes, and the
    threads compress and write (ISA-L, CRC32C, file writes: C with the GIL released).
    `--direct_running_mode=multi_processing` still works (benchmarks/ingest.py measures both)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    options = PipelineOptions(pipeline_args)
    if not options.view_as(StandardOptions).runner:
        options.view_as(StandardOptions).runner = "DirectRunner"
        direct = options.view_as(DirectOptions)
        if not any(a.startswith("--direct_running_mode") for a in pipeline_args):
            direct.direct_running_mode = "multi_threading"
        if not any(a.startswith("--direct_num_workers") for a in pipeline_args):
            direct.direct_num_workers = os.cpu_count() or 1
    return options


def _last_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
