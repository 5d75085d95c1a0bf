"""A failed Beam job, or a span that cannot be written whole, ends the ingest with one line, frees
ROOT's lock and publishes nothing, even when the runner itself never returns."""
import errno
import os
import subprocess
import sys
import threading

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import bounded
from beam_jobs import ingest as ingest_module
from beam_jobs import statistics as statistics_module
from components.common.beam_runner import runner_for
from components.common.lease import exclusive
from components.contracts.layout import Root
from components.contracts.results import SpanManifest
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, ingest
from tests.full_disk import small_disk

# The ingest program, except that one record write blocks for good (a hung network mount) and the
# next fails as on a full disk: the runner may then wait for the blocked worker forever. The sources are
# staged as two lists, which the job spreads over its two workers.
FULL_AND_HUNG = """import errno, os, sys, threading
from beam_jobs import bounded, ingest, job, shards
job.CHUNK = 6
calls, lock, blocked = [], threading.Lock(), threading.Event()
def add(self, unit):
    with lock:
        calls.append(1)
        first = len(calls) == 1
    if first:
        blocked.set()
        threading.Event().wait()
    blocked.wait()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.uri)
shards.RecordFile.add = add
bounded.GRACE = 2.0
sys.exit(ingest.run(sys.argv[1:]))"""


# A caller of ingest in its own process (a test runner, a notebook) with a thread of its own that is
# no daemon: a failed ingest returns its code to it instead of ending the process.
CALLER_WITH_A_THREAD = """import sys, threading
from beam_jobs import ingest
done = threading.Event()
threading.Thread(target=done.wait, name="the caller's").start()
code = ingest.run(sys.argv[1:])
print("returned", code, flush=True)
done.set()"""


def folder_of_images(path, count=12):
    for index in range(count):
        folder = path / ("cat" if index % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index}.jpg").write_bytes(images.rgb_jpeg(seed=index))
    return path


def test_a_full_disk_beside_a_hung_worker_ends_with_one_line_and_frees_root(tmp_path):
    source, root = folder_of_images(tmp_path / "source"), tmp_path / "root"
    env = {key: value for key, value in os.environ.items() if key != "STOKE_DEBUG"}
    # A hang fails here through the timeout; before the bound it did, or printed Beam's tracebacks.
    result = subprocess.run([sys.executable, "-c", FULL_AND_HUNG, str(source), "--root", str(root),
                             "--direct_running_mode=multi_threading", "--direct_num_workers=2"],
                            env=env, capture_output=True, text=True, timeout=180)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("stoke ingest: error: the Beam job failed, nothing was published")
    assert "cannot be written: no space left on device" in lines[0]
    with exclusive(Root(str(root)).ingest_lock, "test"):  # free: the next ingest can take it
        pass
    assert list((root / "data" / "spans").iterdir()) == []


def test_a_runner_that_outlives_a_real_worker_failure_is_left_behind(monkeypatch):
    """Beam reports the failed bundle on its SDK worker's logger; a job still running GRACE seconds
    later is given up on, with the worker's error (this fails if a Beam upgrade moves the report)."""
    monkeypatch.setattr(bounded, "GRACE", 0.5)
    # The job given up on is this test's alone: alive in the process's list, it would make a later
    # failed ingest end the whole process (bounded.exit_code).
    monkeypatch.setattr(bounded, "_ABANDONED", [])
    release = threading.Event()

    def fail(element):
        raise OSError(errno.ENOSPC, "No space left on device", "/full/disk")

    def job():
        try:
            options = PipelineOptions(["--direct_running_mode=multi_threading", "--direct_num_workers=2"])
            with beam.Pipeline(runner=runner_for(options), options=options) as pipeline:  # the ingest job's runner
                _ = pipeline | beam.Create([1]) | beam.Map(fail)
        finally:
            release.wait(60)  # the runner does not return

    try:
        with pytest.raises(bounded.StuckRunner, match=r"No space left on device.*the runner had not stopped"):
            bounded.run(job)
    finally:
        release.set()
    (left,) = bounded._ABANDONED
    left.join(60)
    assert not left.is_alive(), "the job given up on did not end within 60 s of its release"


@pytest.mark.parametrize("owner, step", [(ingest_module, "write_text"), (ingest_module, "write_index"),
                                         (ingest_module, "write_statistics"), (ingest_module, "write_json")])
def test_a_span_that_cannot_be_written_whole_is_withdrawn(tmp_path, capsys, monkeypatch, owner, step):
    """A full disk at each write of publishing (dead letters, content index, statistics, manifest):
    one line naming the file, no span folder left, and the next ingest publishes everything."""
    source, root = folder_of_images(tmp_path / "source", count=4), tmp_path / "root"
    span, write = root / "data" / "spans" / "span-00001", getattr(owner, step)

    def full(*args, **kwargs):
        if not any(str(span) in str(a) or isinstance(a, (SpanManifest, Root)) for a in args):
            return write(*args, **kwargs)  # staging, before publishing
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(span / "x"))

    with monkeypatch.context() as patch:
        patch.setattr(owner, step, full)
        code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and summary["error"].endswith("cannot be written: no space left on device; nothing was published")
    assert list((root / "data" / "spans").iterdir()) == []
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["span"] == 1 and summary["new_sources"] == 4


def test_a_full_disk_at_the_second_statistics_file_leaves_no_span(tmp_path, capsys, monkeypatch):
    """Split-train's statistics written, Split-eval's not: the half-written span folder goes too."""
    source, root = folder_of_images(tmp_path / "source", count=4), tmp_path / "root"
    write = statistics_module.write_bytes

    def full(uri, data):
        if "Split-eval" in uri:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), uri)
        return write(uri, data)

    with monkeypatch.context() as patch:
        patch.setattr(statistics_module, "write_bytes", full)
        code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and "Split-eval/FeatureStats.pb cannot be written: no space left on device" in summary["error"]
    assert list((root / "data" / "spans").iterdir()) == []
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1


def test_a_full_disk_while_staging_the_source_list_names_the_file(tmp_path, capsys, monkeypatch):
    """fsspec's file objects raise a failed write without the file's name: the line still says where."""
    source, root = folder_of_images(tmp_path / "source", count=2), tmp_path / "root"

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("fsspec.implementations.local.LocalFileOpener.write", full)
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and "sources-00000.jsonl cannot be written: no space left on device" in summary["error"]


@pytest.mark.parametrize("mode", ["in_memory", "multi_threading"])
def test_a_disk_that_fills_as_the_job_writes_shards_names_the_shard_and_publishes_nothing(tmp_path, capsys, monkeypatch,
                                                                                          mode):
    """The disk under ROOT fills once the sources are staged, as the job starts: its workers' shard writes fail
    (fsspec's file names none), the job says which file in its one line, and once there is space the next
    ingest publishes every source."""
    from beam_jobs import job

    source = folder_of_images(tmp_path / "source", count=4)
    with small_disk(tmp_path / "disk") as disk:
        root, start = os.path.join(disk.path, "root"), job.bounded.run

        def full_first(work):
            disk.fill()
            return start(work)

        with monkeypatch.context() as patch:
            patch.setattr(job.bounded, "run", full_first)
            code, summary = ingest(source, root, f"--direct_running_mode={mode}", capsys=capsys)
        assert code == 1 and summary["error"].startswith("the Beam job failed, nothing was published: "), summary
        assert " cannot be written: no space left on device" in summary["error"], summary["error"]
        assert os.path.join(root, "data", "spans") in summary["error"].split(": ")[1], summary["error"]
        assert os.listdir(os.path.join(root, "data", "spans")) == []
        disk.free()
        code, summary = ingest(source, root, f"--direct_running_mode={mode}", capsys=capsys)
        assert code == 0 and summary["span"] == 1 and summary["new_sources"] == 4


@pytest.mark.parametrize("source", ["missing", "empty"])
def test_a_failed_ingest_returns_to_a_caller_whose_own_threads_are_running(tmp_path, source):
    (tmp_path / "empty").mkdir()
    result = subprocess.run([sys.executable, "-c", CALLER_WITH_A_THREAD, str(tmp_path / source), "--root",
                             str(tmp_path / "root")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "returned 1", result.stderr[-2000:]
