"""Images converted on worker processes, one per core, for a Beam runner that runs in this process.

Per image, ingest's work is a libjpeg decode wrapped in a dozen short PIL and numpy calls (the checks:
hashes, quality scores) and a serialisation, most of it holding the GIL: on DirectRunner's threads two
cores convert no faster than one, while two processes convert about twice as fast
(docs/benchmarks.md#ingest). DirectRunner's own worker processes import all of Beam each and hand every
element across gRPC, so here plain processes (`python -m beam_jobs.image_pool`, which imports
beam_jobs/records.py and nothing of Beam) convert batches of sources sent down a pipe, and the records
come back to Beam's threads, which write them. They are started, not forked: a fork of a
process with threads can inherit a lock some thread held, and multiprocessing's spawn would import the
caller's script again.

They are started before Beam is imported and convert the first AHEAD_BYTES of sources while Beam loads
and starts the job (`prefetch`; the job `claim`s each once). They frame and compress each record too
(beam_jobs/shards.py's units), so Beam's threads only write.

Starting them costs a few tenths of a second, so only arrivals of POOL_FROM images or more use them;
runners that place work on processes of their own (DirectRunner's multi_processing, Flink, Dataflow)
never do (beam_jobs/job.py decides). The pools end with the job (`shut_down`).
"""
from __future__ import annotations

import argparse
import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from beam_jobs.records import Conversion, Converter

POOL_FROM = 500  # images; below, starting processes costs about what they save (docs/benchmarks.md#ingest)
BATCH = 16  # sources a task: few enough to keep every process busy to the end, enough to amortise the pipe
AHEAD_BYTES = 64 * 1024 * 1024  # of sources converted while Beam loads and starts: what it may hold then
NICE = 5  # workers yield to the driver: Beam's threads feed them and write what they return

_pools: dict[tuple[int, Conversion], Pool] = {}
_lock = threading.Lock()


def processes_for(images: int, pipeline_args: list[str]) -> int:
    """How many worker processes convert an arrival of `images` under Beam's `pipeline_args`: one a core
    when the runner runs the job on this process's threads, the case where they pay; 0 to convert in
    Beam's own workers."""
    cores = os.cpu_count() or 1
    return cores if on_threads(pipeline_args) and cores > 1 and images >= POOL_FROM else 0


def on_threads(pipeline_args: list[str]) -> bool:
    """Whether the runner runs the job on this process's threads (DirectRunner, but for its multi_processing
    mode). Read from the arguments as Beam parses them, without importing Beam, so the processes start
    while Beam loads."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--runner", default="DirectRunner")
    parser.add_argument("--direct_running_mode", default="multi_threading")
    try:
        given, _ = parser.parse_known_args(pipeline_args)
    except argparse.ArgumentError:
        return False  # `--runner` with no value: Beam says what is wrong with it
    runner = given.runner.lower().removesuffix("runner")
    return runner in ("direct", "bundlebaseddirect", "switchingdirect") and given.direct_running_mode != "multi_processing"


class WorkerFailed(RuntimeError):
    """A worker process ended or raised while converting a batch."""


class Pool:
    """`processes` workers, each converting one batch at a time; a thread per worker waits on its pipe."""

    def __init__(self, processes: int, conversion: Conversion):
        code = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p)}
        self.idle: queue.Queue[subprocess.Popen] = queue.Queue()
        self.workers = [subprocess.Popen([sys.executable, "-m", "beam_jobs.image_pool"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env) for _ in range(processes)]
        for worker in self.workers:
            _send(worker.stdin, conversion)
            self.idle.put(worker)
        self.threads = ThreadPoolExecutor(processes, thread_name_prefix="image-pool")
        self.ahead: dict[str, tuple[Future, int]] = {}

    def submit(self, sources: list[dict]) -> Future:
        """A future of each source's (record, None) or (None, dead-letter reason)."""
        return self.threads.submit(self._convert, sources)

    def prefetch(self, sources: list[dict]) -> None:
        """Converts `sources` now, before the job asks (`claim`): Beam takes seconds to load and start
        the job, in which the workers would wait."""
        for start in range(0, len(sources), BATCH):
            batch = sources[start:start + BATCH]
            future = self.submit(batch)
            self.ahead.update((source["uri"], (future, index)) for index, source in enumerate(batch))

    def claim(self, source: dict) -> Future | None:
        """The future of [(record, reason)] of a source converted ahead, once; None if it was not."""
        ahead = self.ahead.pop(source["uri"], None)  # one pop per source: a retried bundle converts anew
        if ahead is None:
            return None
        future, index = ahead
        one: Future = Future()
        future.add_done_callback(lambda done: _settle(one, done, index))
        return one

    def _convert(self, sources: list[dict]):
        worker = self.idle.get()
        try:
            _send(worker.stdin, sources)
            ok, answer = pickle.load(worker.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            raise WorkerFailed(f"an image worker process ended (exit code {worker.poll()}) while converting "
                               f"{sources[0]['uri']} or one of the {len(sources) - 1} after it") from None
        finally:
            self.idle.put(worker)
        if not ok:
            raise WorkerFailed(answer)
        return answer

    def close(self, wait: bool) -> None:
        self.threads.shutdown(wait=wait, cancel_futures=True)
        for worker in self.workers:
            if wait:
                worker.stdin.close()  # the worker ends at the end of its input
                worker.wait()
            else:
                worker.kill()  # a stuck job's worker may never finish its batch


def pool(processes: int, conversion: Conversion) -> Pool:
    """The one pool of this job (shared by Beam's threads), started on first use."""
    key = (processes, conversion)
    with _lock:
        if key not in _pools:
            _pools[key] = Pool(processes, conversion)
        return _pools[key]


def shut_down(wait: bool = True) -> None:
    """Ends the job's pools: their processes exit once their batch is done (waited for with `wait`)."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for each in pools:
        each.close(wait)


def _settle(one: Future, batch: Future, index: int) -> None:
    if batch.exception() is not None:
        one.set_exception(batch.exception())
    else:
        one.set_result([batch.result()[index]])


def _send(pipe, value) -> None:
    pickle.dump(value, pipe, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.flush()


def serve(requests, answers) -> None:
    """A worker: the Conversion first, then batches of sources until the input ends."""
    convert = Converter(pickle.load(requests))
    while True:
        try:
            sources = pickle.load(requests)
        except EOFError:
            return
        try:
            answer = (True, [convert(source) for source in sources])
        except Exception as error:  # not a bad file (those are dead letters): a fault, for the job to report
            answer = (False, f"{type(error).__name__}: {error}")
        _send(answers, answer)


if __name__ == "__main__":
    # Answers go to the pipe on the original stdout; anything a library prints goes to stderr instead.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    os.nice(NICE)
    serve(sys.stdin.buffer, answers)
    os._exit(0)  # every answer is flushed: the interpreter's teardown would only keep the job waiting
