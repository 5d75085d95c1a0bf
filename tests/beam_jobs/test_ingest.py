"""The ingest job end to end on real files: exactly once, dead letters, crashes, S3."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_jobs import job, progress
from beam_jobs.ingest import ingest as ingest_with_progress
from beam_jobs.ingest import run
from components.common.files import filesystem, join, read_json
from components.common.spans import Spans
from components.contracts import schema
from components.contracts.layout import DEAD_LETTER, MANIFEST, TF_COMPRESSION, Root
from components.contracts.run_config import RunConfig
from tests.beam_jobs import images
from tests.prism import prism_tried
from tests.waiting import wait_for

IN_MEMORY = ["--direct_running_mode=in_memory"]
# The ingest program, except that reading a file named stuck.jpg never ends.
HANGS_ON_STUCK = """import sys, time
from beam_jobs import ingest, records
read = records.read_source
records.read_source = lambda s, m: time.sleep(3600) if s["uri"].endswith("stuck.jpg") else read(s, m)
sys.exit(ingest.run(sys.argv[1:]))"""


def ingest(source, root, *extra, capsys=None):
    code = run([str(source), "--root", str(root), "--json", *extra])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1]) if capsys else None
    return code, summary


def records(root, manifest):
    """Every record of a span, parsed, with its decoded image; each shard checked against the size and
    SHA-256 its manifest records (what a cached copy must match)."""
    found = []
    for split in schema.SPLITS:
        folder = Root(str(root)).span(manifest["span"])
        files = [join(folder, s["file"]) for s in manifest["shards"] if s["split"] == split]
        for shard, path in zip((s for s in manifest["shards"] if s["split"] == split), files):
            data = filesystem(path)[0].cat_file(path)
            assert (len(data), hashlib.sha256(data).hexdigest()) == (shard["bytes"], shard["sha256"]), path
        for data in tf.data.TFRecordDataset(files, TF_COMPRESSION[manifest["compression"]]):
            parsed = tf.io.parse_single_example(data, schema.feature_spec())
            pixels = tf.io.decode_image(parsed[schema.ENCODED], expand_animations=False).numpy()
            found.append({"split": split, "pixels": pixels, **{
                k: (v.numpy().decode() if v.dtype == tf.string else int(v))
                for k, v in parsed.items() if k != schema.ENCODED}})
    return found


def dead_letters(root, span):
    text = open(os.path.join(Root(str(root)).span(span), DEAD_LETTER), encoding="utf-8").read()
    return [json.loads(line) for line in text.splitlines()]


def test_awkward_and_broken_files_end_in_a_span_or_dead_letter_exactly_once(awkward_folder, tmp_path, capsys):
    root = tmp_path / "root"
    code, summary = ingest(awkward_folder, root, "--max-bad-fraction", "0.5", "--eval-fraction", "0.3",
                           "--near-copies", "report", capsys=capsys)  # the awkward pictures are near-copies
    assert code == 0 and summary["published"] and summary["span"] == 1
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    labels = read_json(str(root / "data" / "labels.json"))
    assert labels == ["cat", "dog"] == manifest["labels"]

    found = records(root, manifest)
    for record in found:
        assert record["pixels"].dtype == np.uint8 and record["pixels"].shape[2] == 3
        assert record["pixels"].shape[:2] == (record[schema.HEIGHT], record[schema.WIDTH])
        assert labels[record[schema.LABEL]] == record[schema.TEXT]
        assert os.path.relpath(record[schema.SOURCE], awkward_folder).split(os.sep)[0] == record[schema.TEXT]
    dead = dead_letters(root, 1)
    images_on_disk = {str(p) for p in awkward_folder.rglob("*") if p.is_file()
                      and p.name not in ("labels.txt", ".DS_Store")}
    in_span = [r[schema.SOURCE] for r in found]
    assert sorted(in_span + [d["uri"] for d in dead]) == sorted(images_on_disk)
    copies = [d for d in dead if d["reason"].startswith("duplicate of")]
    assert {os.path.basename(d["uri"]) for d in dead if d not in copies} == set(images.BROKEN)
    # rgb.jpg and "ünïcödé 画像.jpg" hold the same bytes, as do rgb.png and really-a-png.jpg: one of each is kept
    assert sorted(os.path.basename(d["uri"]) for d in copies) in (
        sorted(pair) for pair in [(a, b) for a in ("rgb.jpg", "ünïcödé 画像.jpg") for b in ("rgb.png", "really-a-png.jpg")])
    assert manifest["counts"] == {"train": sum(r["split"] == "train" for r in found),
                                  "eval": sum(r["split"] == "eval" for r in found), "dead_letter": 6, "duplicates": 2}
    assert {r["split"] for r in found} == {"train", "eval"}
    assert len(manifest["sources"]) == len(images_on_disk)
    assert os.listdir(root / "data" / "spans") == ["span-00001"]  # no staging left behind


def test_limits_shrink_large_photos_set_bombs_aside_and_are_recorded(tmp_path, capsys):
    source = tmp_path / "source"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "large.jpg").write_bytes(images.photo_jpeg(320, 240))
    (source / "cat" / "small.jpg").write_bytes(images.rgb_jpeg())
    (source / "cat" / "bomb.png").write_bytes(images.png_declaring(13000, 13000))
    code, summary = ingest(source, tmp_path / "root", "--max-side", "64", "--max-megapixels", "1",
                           "--max-bad-fraction", "0.5", *IN_MEMORY, capsys=capsys)
    assert code == 0
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    assert manifest["max_side"] == 64 and manifest["settings"]["max_megapixels"] == 1
    sizes = {os.path.basename(r[schema.SOURCE]): (r[schema.WIDTH], r[schema.HEIGHT])
             for r in records(tmp_path / "root", manifest)}
    assert sizes == {"large.jpg": (64, 48), "small.jpg": (32, 24)}
    [bomb] = dead_letters(tmp_path / "root", 1)
    assert bomb["reason"].startswith("too many pixels to decode safely: 13000x13000")


def test_a_rerun_publishes_nothing_and_new_files_make_a_new_span(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    for i in range(3):
        (source / "cat" / f"{i}.jpg").write_bytes(images.rgb_jpeg(seed=i))
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1

    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"] and "nothing new" in summary["message"]

    (source / "ant").mkdir()
    (source / "ant" / "new.png").write_bytes(images.rgb_png())
    (source / "cat" / "3.jpg").write_bytes(images.rgb_jpeg(seed=3))
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert summary["span"] == 2 and summary["new_sources"] == 2
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    assert manifest["labels"] == ["cat", "ant"]  # appended: cat keeps id 0
    assert sorted((r[schema.TEXT], r[schema.LABEL]) for r in records(root, manifest)) == [("ant", 1), ("cat", 0)]

    (source / "cat" / "0.jpg").write_bytes(images.rgb_jpeg(seed=7))  # a changed file is new again
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["new_sources"] == 1


@pytest.mark.parametrize("runner", [[], ["--runner", "DirectRunner", "--direct_running_mode=multi_processing",
                                             "--direct_num_workers=1"]], ids=["threads", "worker-processes"])
def test_a_local_job_runs_on_beams_fnapi_runner_and_never_tries_prism(runner, tmp_path, capsys, monkeypatch):
    """On this process's threads (no runner given) or DirectRunner's worker processes, the job runs on the
    FnApiRunner the suite tests, never on the PrismRunner that DirectRunner tries first: its binary is a
    download from github.com as the job starts, which waits without end on a network that drops it."""
    tried = prism_tried(monkeypatch)
    source = tmp_path / "source"
    (source / "cat").mkdir(parents=True)
    for i in range(2):
        (source / "cat" / f"{i}.jpg").write_bytes(images.rgb_jpeg(seed=i))
    code, summary = ingest(source, tmp_path / "root", *runner, capsys=capsys)
    assert code == 0 and summary["published"] and summary["new_sources"] == 2, summary
    assert tried == []


def test_too_many_bad_files_publish_nothing(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "ok.jpg").write_bytes(images.rgb_jpeg())
    (source / "cat" / "bad.jpg").write_bytes(images.truncated_jpeg())
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and "1 of 2 new sources (50.0%, copies aside) are unreadable or broken" in summary["error"]
    assert "bad.jpg: truncated or corrupt JPEG" in summary["error"]
    assert Spans(str(root)).manifests() == [] and os.listdir(root / "data" / "spans") == []
    assert not (root / "data" / "labels.json").exists()


def test_bad_settings_and_sources_are_one_clear_line(tmp_path, capsys):
    code, summary = ingest(tmp_path / "missing", tmp_path / "root", capsys=capsys)
    assert code == 1 and summary["error"] == f"source {tmp_path / 'missing'} does not exist"
    code, summary = ingest(tmp_path, tmp_path / "root", "--eval-fraction", "2", capsys=capsys)
    assert code == 2 and summary["error"].startswith("--eval-fraction: ")


def test_a_killed_job_publishes_nothing_and_the_rerun_cleans_up(tmp_path):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    for i in range(40):
        (source / "cat" / f"{i:02d}.jpg").write_bytes(images.rgb_jpeg(seed=i))
    (source / "cat" / "stuck.jpg").write_bytes(images.rgb_jpeg(seed=99))  # its read never ends: the job hangs
    spans = root / "data" / "spans"
    job = subprocess.Popen([sys.executable, "-c", HANGS_ON_STUCK, str(source), "--root", str(root)],
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: list(spans.glob("_staging-*/*.part")), "the job to start writing", every=0.05)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert Spans(str(root)).manifests() == []

    (spans / "span-00001").mkdir()  # as if killed while publishing, before the manifest
    (spans / "span-00001" / "train-00000-of-00001.tfrecord.gz").write_bytes(b"partial")
    temporary = tmp_path / "tmp"  # the rerun's own: what the Beam job puts there goes with it
    temporary.mkdir()
    result = subprocess.run([sys.executable, "-m", "beam_jobs.ingest", str(source), "--root", str(root), "--json"],
                            capture_output=True, text=True, check=True, env={**os.environ, "TMPDIR": str(temporary)})
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["span"] == 2  # a name that was ever used is not used again
    assert list(temporary.iterdir()) == []
    assert len(summary["removed_debris"]) == 2
    assert sorted(os.listdir(spans)) == ["span-00002"]
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    assert manifest["counts"]["train"] + manifest["counts"]["eval"] == 41
    assert len(records(root, manifest)) == 41


def test_a_second_ingest_into_the_same_root_waits_its_turn(tmp_path, capsys):
    """A nightly run and one a notification started meet: the second waits for the first, then ingests."""
    import fcntl
    import threading

    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "a.jpg").write_bytes(images.rgb_jpeg())
    (root / "data").mkdir(parents=True)
    said, done = [], []
    with open(root / "data" / ".ingest.lock", "a") as held:  # as a running job holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        second = threading.Thread(target=lambda: done.append(ingest(source, root, *IN_MEMORY)))
        second.start()
        wait_for(lambda: said.append(capsys.readouterr().err) or "waiting up to 60 min" in "".join(said),
                 "the second ingest to say it waits", 120, every=0.1)
        assert not done  # still waiting while the lock is held
    second.join(300)
    assert done == [(0, None)]
    assert f"stoke ingest: another ingest is writing into {root} (another process holds {root}/data/.ingest.lock); " \
           "waiting up to 60 min for it to finish" in "".join(said)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["span"] == 1


def test_an_ingest_that_waited_its_time_or_would_not_wait_says_so(tmp_path, capsys):
    import fcntl

    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "a.jpg").write_bytes(images.rgb_jpeg())
    (root / "data").mkdir(parents=True)
    with open(root / "data" / ".ingest.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, summary = ingest(source, root, "--wait-minutes", "0.01", *IN_MEMORY, capsys=capsys)
        assert code == 1 and summary["error"] == (f"another ingest is still writing into {root} after 0.01 min "
                                                  "(ingest.wait_minutes); run again when it has finished")
        code, summary = ingest(source, root, "--wait-minutes", "0", *IN_MEMORY, capsys=capsys)
        assert code == 1 and summary["error"] == f"another ingest is writing into {root}; run again when it has finished"
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1


def test_an_unwritable_root_is_one_clear_line(tmp_path, capsys):
    source = tmp_path / "source"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "a.jpg").write_bytes(images.rgb_jpeg())
    (tmp_path / "file").write_text("not a folder")
    code, summary = ingest(source, tmp_path / "file" / "root", *IN_MEMORY, capsys=capsys)
    assert code == 1 and "file" in summary["error"] and not summary["published"]


def test_manifest_rows_outside_its_folder_are_dead_letters_unless_allowed(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "img").mkdir(parents=True)
    for i in range(3):
        (source / "img" / f"{i}.jpg").write_bytes(images.rgb_jpeg(seed=i))
    (tmp_path / "elsewhere.jpg").write_bytes(images.rgb_jpeg(seed=9))
    (source / "m.csv").write_text("img/0.jpg,cat\n./img/1.jpg,cat\nimg/../img/2.jpg,cat\nimg/0.jpg,cat\n"
                                  "../elsewhere.jpg,cat\n")
    code, summary = ingest(source / "m.csv", root, *IN_MEMORY, "--max-bad-fraction", "0.5", capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 3  # three spellings, one file
    assert [(d["uri"], d["reason"]) for d in dead_letters(root, 1)] == [
        (str(tmp_path / "elsewhere.jpg"), f"outside the manifest's folder {source}; --allow-outside-source reads it")]

    code, summary = ingest(source / "m.csv", root, *IN_MEMORY, "--allow-outside-source", capsys=capsys)
    assert code == 0 and summary["span"] == 2 and summary["new_sources"] == 1
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    assert [s["uri"] for s in manifest["sources"]] == [str(tmp_path / "elsewhere.jpg")]


def cat_and_dog_span(tmp_path, capsys):
    """(source, root): a source of one cat and one dog, published as span 1 with labels [cat, dog]."""
    source, root = tmp_path / "source", tmp_path / "root"
    for name in ("cat", "dog"):
        (source / name).mkdir(parents=True)
        (source / name / "0.jpg").write_bytes(images.rgb_jpeg())
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    return source, root


def test_a_lost_labels_file_keeps_every_label_id(tmp_path, capsys):
    source, root = cat_and_dog_span(tmp_path, capsys)
    (root / "data" / "labels.json").unlink()
    (source / "ant").mkdir()
    (source / "ant" / "0.jpg").write_bytes(images.rgb_jpeg(seed=2))
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["span"] == 2
    assert read_json(str(root / "data" / "labels.json")) == ["cat", "dog", "ant"]
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    assert [(r[schema.TEXT], r[schema.LABEL]) for r in records(root, manifest)] == [("ant", 2)]


def test_labels_that_disagree_with_a_published_span_stop_ingest(tmp_path, capsys):
    source, root = cat_and_dog_span(tmp_path, capsys)
    (root / "data" / "labels.json").write_text('["dog", "cat"]')
    (source / "cat" / "1.jpg").write_bytes(images.rgb_jpeg(seed=1))
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and summary["error"] == (
        f"label id 0 is 'dog' in {root}/data/labels.json but 'cat' in {Root(str(root)).manifest(1)}; "
        "ids must never change: restore labels.json from the spans' manifests")
    assert Spans(str(root)).span_numbers() == [1]


def test_a_broken_span_manifest_is_one_line_naming_it(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "0.jpg").write_bytes(images.rgb_jpeg())
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    manifest = Root(str(root)).manifest(1)
    with open(manifest, "w") as f:
        f.write('{"span": 1,')  # cut short
    assert run([str(source), "--root", str(root), "--json", *IN_MEMORY]) == 1
    captured = capsys.readouterr()
    error = json.loads(captured.out.strip().splitlines()[-1])["error"]
    assert error.startswith(f"{manifest} is not JSON: ")
    assert captured.err.strip() == f"stoke ingest: error: {error}"


def test_progress_events_count_the_mb_converted_and_stop_with_the_runner(monkeypatch):
    monkeypatch.setattr(progress, "EVERY", 0.01)
    seen = []
    with progress.Shown("job", 8_000_000, seen.append):
        progress.converted("job", 2_000_000)
        progress.converted("another job", 1_000_000)
        wait_for(lambda: seen, "a progress event", seconds=30, every=0.01)
        count = len(seen)
    assert len(seen) == count + 1  # and the last, as the job ended
    time.sleep(0.1)  # ten of the watcher's polls: an event after the block would show by now
    assert len(seen) == count + 1  # none after the block: none can follow the summary
    assert (seen[0].stage, seen[0].done, seen[0].total, seen[0].unit, seen[0].fraction) == ("ingest", 2, 8, "MB", 0.25)

    seen.clear()
    with pytest.raises(OSError), progress.Shown("job", 8_000_000, seen.append):
        raise OSError("a job that fails ends without a last event")
    assert seen == []


def test_progress_never_passes_its_total_and_ends_at_it(tmp_path, monkeypatch):
    """Records larger than their sources (small PNGs of noise: framed, in a GZIP member each) and staged
    lists and signatures beside them: the MB written would pass the MB read, the MB converted cannot."""
    monkeypatch.setattr(progress, "EVERY", 0.02)
    source = noise_folder(tmp_path / "source", 400, side=48)
    events = []
    config = RunConfig(source=str(source), root=str(tmp_path / "root"))
    summary = ingest_with_progress(config, ["--direct_num_workers=2"], events.append)
    assert summary.published and summary.bytes_out > summary.bytes_in
    total = round(summary.bytes_in / 1e6, 1)
    assert len(events) > 1 and all(e.total == total and e.done <= total for e in events)
    assert events[-1].done == total


def noise_folder(path, count, side=16):
    """`count` distinct small PNGs of noise in four class folders: cheap to make by the thousand."""
    rng = np.random.default_rng(0)
    for index in range(count):
        folder = path / f"class{index % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:06d}.png").write_bytes(images.encode(
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)), "PNG"))
    return path


def test_every_source_of_a_long_job_crosses_beams_data_plane(tmp_path, capsys, monkeypatch):
    """DirectRunner hands the staged sources from the threads that read them to the shuffle in buffers that a
    timer also flushes, every second: a job of minutes flushes them hundreds of times while they are written.
    Here it flushes every millisecond and each send waits a millisecond, as on a busy machine, while two staged
    lists are read at once: every source ends in a record or a dead letter."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.runners.worker import data_plane

    monkeypatch.setattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS", 1)
    send = data_plane._GrpcDataChannel._enqueue_to_send
    monkeypatch.setattr(data_plane._GrpcDataChannel, "_enqueue_to_send",
                        lambda channel, element: time.sleep(0.001) or send(channel, element))
    monkeypatch.setattr(job, "CHUNK", 500)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # converted on the image workers, as an arrival this size is
    source = noise_folder(tmp_path / "source", 2000)
    for index in range(20):
        (source / "class0" / f"broken{index}.jpg").write_bytes(images.truncated_jpeg())
    code, summary = ingest(source, tmp_path / "root", "--direct_num_workers=2", capsys=capsys)
    assert code == 0 and summary["published"], summary
    assert summary["counts"] == {"train": summary["counts"]["train"], "eval": 2000 - summary["counts"]["train"],
                                 "dead_letter": 20, "duplicates": 0}


def test_beams_timed_flush_drops_what_is_written_while_it_sends():
    """Why the job flushes Beam's data plane by size alone (beam_jobs/job.py): a timed flush sends the buffer and
    then empties it, so a write landing in between is lost. When a Beam upgrade keeps it, this fails and says so."""
    from apache_beam.runners.worker.data_plane import TimeBasedBufferingClosableOutputStream

    sent = []

    def send(data):
        sent.append(data)
        stream.write(b" and meanwhile")  # the bundle's thread writes while the timer's thread sends

    stream = TimeBasedBufferingClosableOutputStream(sent.append, send, time_flush_threshold_ms=3_600_000)
    stream.write(b"first")
    stream.flush()
    stream.close()
    assert b"".join(sent) == b"first", "Beam keeps what is written during a timed flush now: the job may use its timer"


def test_a_span_number_a_lineage_names_is_never_published_again(tmp_path, capsys):
    """Span folders deleted by hand leave their numbers in the lineages of the models trained on them (served,
    rolled back or retired, of any model): new records under such a number would pass for those a model
    learnt. A lineage that cannot be read could name any number: nothing is published until it can be."""
    from components.common.repository import RETIRED, ROLLED_BACK_PREFIX
    from tests.components.common.test_run_retention import SAMPLE_LINEAGE, serve

    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "0.jpg").write_bytes(images.rgb_jpeg(seed=0))
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1

    def names(uri, spans):
        lineage = read_json(uri if os.path.exists(uri) else str(SAMPLE_LINEAGE))
        lineage["spans"] = [lineage["spans"][0] | {"span": n} for n in spans]
        os.makedirs(os.path.dirname(uri), exist_ok=True)
        with open(uri, "w") as f:
            json.dump(lineage, f)

    served = serve(str(root), tmp_path, 100, "a")
    names(served.lineage_uri(100), [1, 2])
    other = serve(str(root), tmp_path, 200, "b", model="other")
    names(other.lineage_uri(200), [4])
    os.rename(other.version_uri(200), os.path.join(other.uri, f"{ROLLED_BACK_PREFIX}200"))  # rolled back
    names(os.path.join(served.uri, RETIRED, "50.json"), [6])  # retired
    shutil.rmtree(Root(str(root)).span(1))  # the newest span deleted by hand

    (source / "cat" / "1.jpg").write_bytes(images.rgb_jpeg(seed=1))
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["span"] == 7, summary

    (source / "cat" / "2.jpg").write_bytes(images.rgb_jpeg(seed=2))
    for broken in ("{not json", "5"):
        with open(served.lineage_uri(100), "w") as f:
            f.write(broken)
        code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
        assert code == 1 and "the lineage of version 100 of model stoke" in summary["error"], summary
        assert "could name any span" in summary["error"] and Spans(str(root)).published() == [7]
