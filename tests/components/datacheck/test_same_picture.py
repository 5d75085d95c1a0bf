"""A flood is many files of one picture, as ingest judged them: exact copies, and near-copies whose block colours
agree. A fixed camera's distinct frames, alike at dHash's 9x8 thumbnail, are no flood and train, under one label
or two; a stuck camera's frames (one picture, each with its own sensor noise) and byte-identical re-uploads are a
flood and quarantine the span. Real JPEGs through the real Beam ingest and the data check's program."""
import json
import os
import shutil
from collections import Counter

from beam_jobs.ingest import run as ingest
from components.common.images import normalize
from components.common.spans import Spans
from components.contracts.layout import Root
from components.datacheck import datacheck
from tests.beam_jobs import images

IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def write(folder, frames, stem: str) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{stem}-{i:03d}.jpg" for i in range(len(frames))]
    for path, frame in zip(paths, frames):
        path.write_bytes(images.encode(frame, "JPEG", quality=90))
    return [str(p) for p in paths]


def check(root: str, capsys) -> dict:
    """The data check's program on ROOT; its summary of the newest span."""
    assert datacheck.run(["--root", root, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["spans"][-1]


def errors(checked: dict) -> list[str]:
    return [a["kind"] for a in checked["anomalies"] if a["severity"] == "error"]


def test_the_frames_are_what_the_old_rule_took_for_a_flood():
    """Half the passing frames share one dHash (the old rule's 20% and more) and a stuck camera's share it whole."""
    passing = Counter(normalize(images.encode(f, "JPEG", quality=90), 512).pixels.dhash for f in images.passing_frames(60))
    stuck = Counter(normalize(images.encode(f, "JPEG", quality=90), 512).pixels.dhash for f in images.stuck_frames(10))
    assert max(passing.values()) > 0.2 * 60 and len(stuck) == 1


def test_distinct_frames_of_one_camera_are_no_flood_and_train_under_one_label_or_two(tmp_path, capsys):
    source, root = tmp_path / "source", str(tmp_path / "root")
    frames = images.passing_frames(60)
    write(source / "empty", frames[::2], "frame")  # two labels over one camera: no label conflict either
    write(source / "busy", frames[1::2], "frame")
    assert ingest([str(source), "--root", root, *IN_MEMORY]) == 0
    capsys.readouterr()
    checked = check(root, capsys)
    assert checked["status"] in ("ok", "warning") and errors(checked) == [], checked
    assert {s.span for s in Spans(root).shards("train")} == {1}  # what training reads
    manifest = Spans(root).read_manifest(1)
    assert (manifest.same_picture.count, manifest.same_picture.total) == (1, 60) and manifest.anomalies == []

    # The same span as ingest published it before it judged pictures: the one dHash half its records share.
    path = Root(root).manifest(1)
    with open(path) as f:
        data = json.load(f)
    del data["same_picture"]
    with open(path, "w") as f:
        json.dump(data, f)
    old = check(root, capsys)
    assert old["status"] == "quarantined" and errors(old) == ["same_image_flood"]
    (flood,) = [a for a in old["anomalies"] if a["kind"] == "same_image_flood"]
    assert "published before ingest told distinct frames" in flood["message"] and "release it" in flood["message"]


def test_a_stuck_camera_is_a_flood_and_the_span_is_quarantined(tmp_path, capsys):
    """The camera sent distinct frames on the first night and, on the second, a few more and then one frame
    again and again with sensor noise."""
    source, root = tmp_path / "source", str(tmp_path / "root")
    frames = images.passing_frames(60)
    write(source / "cam", frames[:30], "night1")
    assert ingest([str(source), "--root", root, *IN_MEMORY]) == 0
    write(source / "cam", frames[30:40], "night2")
    stuck = write(source / "cam", images.stuck_frames(60), "night2-stuck")
    assert ingest([str(source), "--root", root, *IN_MEMORY]) == 0
    capsys.readouterr()
    checked = check(root, capsys)  # spans 1 and 2, the newest last
    assert checked["span"] == 2 and checked["status"] == "quarantined", checked
    assert Spans(root).read_manifest(2).same_picture.count == 60
    (flood,) = [a for a in checked["anomalies"] if a["kind"] == "same_image_flood"]
    assert (flood["severity"], flood["count"]) == ("error", 60) and "60 of the span's 70 files (86%" in flood["message"]
    assert set(flood["examples"]) <= set(stuck) and len(flood["examples"]) == 5
    assert {s.span for s in Spans(root).shards("train")} == {1}


def test_byte_identical_frames_kept_out_as_copies_are_still_a_flood(tmp_path, capsys):
    """A looping upload beside a conveyor's frames (whose dHashes differ): the copies are dead letters and one
    record stays, so no two records shared a dHash; the span's files are still one picture."""
    source, root = tmp_path / "source", str(tmp_path / "root")
    (first,) = write(source / "cam", images.stuck_frames(1), "loop")
    for i in range(20):
        shutil.copy(first, os.path.join(source, "cam", f"loop-again-{i:02d}.jpg"))
    write(source / "belt", images.conveyor_frames(60), "frame")
    assert ingest([str(source), "--root", root, *IN_MEMORY]) == 0
    capsys.readouterr()
    checked = check(root, capsys)
    assert checked["status"] == "quarantined" and errors(checked) == ["same_image_flood"], checked
    manifest = Spans(root).read_manifest(1)
    assert manifest.counts.duplicates == 20 and (manifest.same_picture.count, manifest.same_picture.total) == (21, 81)
