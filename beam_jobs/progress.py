"""How far an ingest's job is, as its driver shows it: the MB of new sources the job has converted (into a
record or a dead letter) of the MB of all of them, every EVERY seconds while the runner works, and once more
when it has finished.

Counted where the job converts them (beam_jobs/ingest_pipeline.py, Normalize), so only for a runner that runs the
job on this process's threads (DirectRunner, Stoke's default); a runner of its own processes (Dataflow,
Flink, Spark, DirectRunner's multi_processing) shows its progress in its own UI, and here there is none.
What the job has written is no measure of it: a record is its image framed and compressed beside its
features, and staging holds the source lists and signatures too, so the MB written passed the MB read
(454 of 424 MB for 150,000 small JPEGs) or, with photos shrunk to `ingest.max_side`, never came near it.
Beam-free, as the driver shows progress before Beam is loaded.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from components.contracts.summaries import Progress

EVERY = 10.0  # seconds between two events

_converted: collections.Counter[str] = collections.Counter()  # bytes of sources converted, by job
_lock = threading.Lock()


def converted(job: str, size: int) -> None:
    """Counts a source of `size` bytes that `job` (its staging folder) has converted; Beam's threads call it."""
    with _lock:
        _converted[job] += size


class Shown:
    """Shows the job's progress while the block runs, and once more at its end if it ends without an error;
    none after the block, so none can follow the summary."""

    def __init__(self, job: str, total_bytes: int, show: Callable[[Progress], None]):
        self.job, self.total, self.show = job, total_bytes, show
        self.started, self.done, self.lock = time.monotonic(), threading.Event(), threading.Lock()

    def __enter__(self):
        with _lock:
            _converted.pop(self.job, None)
        threading.Thread(target=self._report, daemon=True).start()
        return self

    def __exit__(self, error_type, *exc):
        with self.lock:
            self.done.set()
            if error_type is None:
                self.show(self._event())
        if hasattr(self.show, "close"):  # a terminal's bar (program.ProgressBar): done before the summary prints
            self.show.close(finished=error_type is None)
        with _lock:
            _converted.pop(self.job, None)

    def _event(self) -> Progress:
        with _lock:
            done = min(_converted[self.job], self.total)  # a bundle a runner retried counts its sources twice
        return Progress(stage="ingest", done=round(done / 1e6, 1), total=round(self.total / 1e6, 1), unit="MB",
                        seconds=round(time.monotonic() - self.started, 1))

    def _report(self):
        while not self.done.wait(EVERY):
            event = self._event()
            with self.lock:
                if not self.done.is_set():
                    self.show(event)
