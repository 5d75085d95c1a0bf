"""Conversion on worker processes gives the spans, dead letters and content index that Beam's threads give."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_jobs import image_pool
from beam_jobs.records import Conversion
from components.common.content_index import read_index
from components.common.files import read_json
from components.contracts import schema
from components.contracts.layout import MANIFEST, Root
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import dead_letters, ingest, records

REPO = Path(__file__).resolve().parents[2]


def _spans(source, later, root, capsys):
    """Ingests `source`, then `later` (near-copies of it: the workers look up the published dHashes);
    returns each span's records, dead letters and content index, in an order that does not depend on timing."""
    found = []
    for folder in (source, later):
        code, summary = ingest(folder, root, "--max-bad-fraction", "0.5", capsys=capsys)
        assert code == 0 and summary["published"], summary
        manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
        kept = sorted((r[schema.SOURCE], r["split"], r[schema.LABEL], r["pixels"].tobytes()) for r in records(root, manifest))
        dead = sorted((d["uri"], d["reason"]) for d in dead_letters(root, summary["span"]))
        total = sum(manifest["counts"][split] for split in ("train", "eval"))
        index = sorted(read_index(Root(str(root)).content_index(summary["span"]), summary["span"], total))
        found.append((manifest["counts"], summary["near_duplicates"], kept, dead, index))
    return found


@pytest.fixture
def arrivals(awkward_folder, tmp_path):
    """The awkward folder, and then a second arrival of re-encoded, mirrored and turned copies of photos
    the first holds."""
    pictures = images.photo_crops(3)
    for i, picture in enumerate(pictures):
        (awkward_folder / "cat" / f"photo{i}.jpg").write_bytes(images.encode(picture, "JPEG", quality=90))
    later = tmp_path / "later"
    for i, picture in enumerate(pictures):
        for kind, data in images.near_copies(picture).items():
            path = later / "dog" / f"photo{i}-{kind}.{'png' if kind == 'crop' else 'jpg'}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return awkward_folder, later


def test_worker_processes_convert_every_kind_of_file_as_beams_threads_do(arrivals, tmp_path, capsys, monkeypatch):
    source, later = arrivals
    threads = _spans(source, later, tmp_path / "threads", capsys)

    started = []
    monkeypatch.setattr(image_pool, "POOL_FROM", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    # About half of each arrival converted ahead of the job, the rest as Beam hands them out.
    monkeypatch.setattr(image_pool, "AHEAD_BYTES", sum(p.stat().st_size for p in source.rglob("*") if p.is_file()) // 2)
    pool = image_pool.pool
    monkeypatch.setattr(image_pool, "pool", lambda *args: started.append(args) or pool(*args))
    processes = _spans(source, later, tmp_path / "processes", capsys)

    assert started and all(processes == 2 for processes, _ in started)
    assert processes == threads
    assert threads[1][1]["count"] > 0  # the second arrival's near-copies were found against the first
    assert not image_pool._pools  # ended with the job


def test_a_worker_process_that_ends_fails_its_batch_naming_the_files(tmp_path):
    sources = [{"uri": str(tmp_path / name), "size": 1, "label": "cat", "label_id": 0, "split": "train", "version": "1"}
               for name in ("a.jpg", "b.jpg")]
    pool = image_pool.Pool(1, Conversion())
    try:
        pool.workers[0].kill()
        pool.workers[0].wait()
        ended = r"ended \(exit code -9\) while converting .*a\.jpg or one of the 1 after"
        with pytest.raises(image_pool.WorkerFailed, match=ended):
            pool.submit(sources).result()
    finally:
        pool.close(wait=False)


def test_sources_converted_ahead_are_claimed_once_each_as_a_batch_converts_them(tmp_path):
    (tmp_path / "a.jpg").write_bytes(images.rgb_jpeg())
    (tmp_path / "b.jpg").write_bytes(images.truncated_jpeg())
    sources = [{"uri": str(tmp_path / name), "size": 1, "label": "cat", "label_id": 0, "split": "train", "version": "1"}
               for name in ("a.jpg", "b.jpg", "c.jpg")]
    pool = image_pool.Pool(1, Conversion())
    try:
        pool.prefetch(sources[:2])
        claimed = [pool.claim(source) for source in sources]
        assert claimed[2] is None  # never converted ahead: the job converts it in a batch
        assert [c.result() for c in claimed[:2]] == [[one] for one in pool.submit(sources[:2]).result()]
        assert claimed[1].result()[0][1].startswith("truncated or corrupt")  # a dead letter, as in a batch
        assert pool.claim(sources[0]) is None  # once: a retried bundle converts its sources again
    finally:
        pool.close(wait=True)


def test_a_batch_converted_ahead_that_fails_fails_each_claim(tmp_path):
    source = {"uri": str(tmp_path / "a.jpg"), "size": 1, "label": "cat", "label_id": 0, "split": "train", "version": "1"}
    pool = image_pool.Pool(1, Conversion())
    try:
        pool.workers[0].kill()
        pool.workers[0].wait()
        pool.prefetch([source])
        with pytest.raises(image_pool.WorkerFailed, match="ended"):
            pool.claim(source).result()
    finally:
        pool.close(wait=False)


def test_a_worker_process_starts_without_beam_tensorflow_or_the_result_models():
    """What it imports is what each of them costs at every start, while the driver loads Beam."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, beam_jobs.image_pool; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True, cwd=REPO).stdout.split()
    assert not {"apache_beam", "tensorflow", "pydantic", "components.contracts.results"} & set(loaded)


def test_a_job_on_threads_loads_beam_without_its_cloud_clients_and_they_still_import_later(tmp_path):
    """Beam's `io` imports BigQuery's, Pub/Sub's and GCS' clients when installed; a job on this process's
    threads needs none, and what imports them afterwards (another runner in the same process) still can."""
    for label in ("a", "b"):
        (tmp_path / "source" / label).mkdir(parents=True)
        for i, picture in enumerate(images.photo_crops(2)):
            (tmp_path / "source" / label / f"{i}.png").write_bytes(images.encode(picture, "PNG"))
    script = ("import sys; from beam_jobs.ingest import run; code = run(sys.argv[1:]); "
              "loaded = 'google.cloud.bigquery' in sys.modules; import apache_beam.io.gcp.bigquery; "
              "print(code, loaded, 'google.cloud.bigquery' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "source"), "--root", str(tmp_path / "root")],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout.split()
    assert out[-3:] == ["0", "False", "True"]
