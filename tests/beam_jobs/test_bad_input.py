"""One bad row, name or file is one dead letter with its reason: never a failed ingest, a traceback or a hang."""
import json
import os

from beam_jobs.pipeline import read_source
from beam_jobs.sources import list_source
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest
from tests.beam_jobs.test_sources import write

FIFO = "not a regular file (a FIFO, socket or device): never opened"


def reasons(listing):
    return [(s.uri.rsplit("/", 1)[-1], r) for s, r in listing.rejected]


def test_an_unreadable_scheme_spelling_is_one_dead_letter(tmp_path):
    write(tmp_path / "a.png")
    (tmp_path / "m.csv").write_text(f"FILE:///tmp/x.png,cat\nFile://{tmp_path}/a.png,cat\nS3://,cat\na.png,cat\n")
    listing = list_source(str(tmp_path / "m.csv"), 0.0)
    assert [s.uri for s in listing.sources] == [str(tmp_path / "a.png")]
    assert [s.uri for s, _ in listing.rejected][:1] == ["/tmp/x.png"]  # outside the manifest's folder
    assert len(listing.rejected) == 2


def test_json_rows_of_any_shape_are_dead_letters(tmp_path):
    write(tmp_path / "a.png")
    lines = ["[1,2]", '"x"', '{"uri": 5, "label": "cat"}', '{"uri": "a.png", "label": ["cat"]}', "7", "null",
             "[" * 100_000 + "]" * 100_000, "{not json", json.dumps({"uri": "a.png", "label": "cat"})]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    listing = list_source(str(tmp_path / "m.jsonl"), 0.0)
    assert [s.uri for s in listing.sources] == [str(tmp_path / "a.png")]
    got = reasons(listing)
    assert [uri for uri, _ in got] == [f"m.jsonl#row{n}" for n in range(1, 9)]
    assert got[0][1] == "manifest row is list, not an object with uri and label"
    assert got[2][1] == "manifest row's uri is not a string" and got[3][1] == "manifest row's label is not a string"
    assert got[6][1].startswith("manifest row is not valid JSON") and got[7][1].startswith("manifest row is not valid JSON")


def test_a_csv_field_over_the_limit_is_one_dead_letter(tmp_path):
    write(tmp_path / "a.png")
    (tmp_path / "m.csv").write_text(f"uri,label\n{'x' * 200_000}.png,cat\na.png,cat\n")
    listing = list_source(str(tmp_path / "m.csv"), 0.0)
    assert [s.uri for s in listing.sources] == [str(tmp_path / "a.png")]
    [(uri, reason)] = reasons(listing)
    assert uri == "m.csv#row1" and reason.startswith("manifest line 2 is not a CSV row: field larger than field limit")


def test_fifos_and_devices_are_refused_before_opening(tmp_path):
    os.makedirs(tmp_path / "cat")
    os.mkfifo(tmp_path / "cat" / "x.png")
    os.symlink("/dev/zero", tmp_path / "cat" / "zero.png")
    assert reasons(list_source(str(tmp_path), 0.0, allow_outside=True)) == [("x.png", FIFO), ("zero.png", FIFO)]
    (tmp_path / "m.csv").write_text("cat/x.png,cat\n/dev/zero,cat\n")
    assert reasons(list_source(str(tmp_path / "m.csv"), 0.0, allow_outside=True)) == [("x.png", FIFO), ("zero", FIFO)]
    try:  # a file that became a FIFO after it was listed
        read_source({"uri": str(tmp_path / "cat" / "x.png"), "size": 0}, None)
    except Exception as error:
        assert str(error) == FIFO
    else:
        raise AssertionError("read a FIFO")


def test_bad_names_rows_and_fifos_end_as_dead_letters_of_one_ingest(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    write(source / "cat" / "ok.jpg", images.rgb_jpeg())
    write(source / os.fsdecode(b"cat/bad-\xff.jpg"), images.rgb_jpeg(seed=3))
    os.mkfifo(source / "cat" / "x.png")
    code, summary = ingest(source, root, "--max-bad-fraction", "1", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 1
    assert {(os.path.basename(d["uri"]), d["reason"].split(" (")[0]) for d in dead_letters(root, 1)} == {
        ("bad-\\xff.jpg", "file name is not valid UTF-8"), ("x.png", "not a regular file")}
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)  # known now: nothing new
    assert code == 0 and not summary["published"]
