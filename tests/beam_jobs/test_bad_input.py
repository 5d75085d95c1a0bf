"""One bad row, name or file is one dead letter with its reason: never a failed ingest, a traceback or a hang.
A SOURCE that holds no images, or a manifest without its columns, is one error line saying so."""
import json
import os

import pytest

from beam_jobs.records import read_source
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


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["error"] in captured.err
    return captured.err.strip()


def test_a_source_without_images_is_an_error_not_nothing_new(tmp_path, capsys):
    """No image at all (an empty folder, one of sidecars and hidden files, an empty manifest) is its own
    error; "nothing new" is for a SOURCE whose images are all published."""
    source, root = tmp_path / "source", tmp_path / "root"
    source.mkdir()
    assert ingest(source, root, *IN_MEMORY)[0] == 1
    assert _error_line(capsys) == (f"stoke ingest: error: SOURCE holds no images: {source} has no image files (.jpg, .png, "
                                   ".gif, .bmp, .tiff, .webp, ...) in class folders; hidden files and sidecars (.txt, .json, "
                                   "...) are not images")
    for sidecar in ("cat/notes.txt", "cat/0.json", "cat/.0.jpg", ".thumbnails/cat/1.jpg"):
        write(source / sidecar)
    assert ingest(source, root, *IN_MEMORY)[0] == 1
    assert "SOURCE holds no images" in _error_line(capsys)
    (tmp_path / "m.csv").write_text("uri,label\n")
    assert ingest(tmp_path / "m.csv", root, *IN_MEMORY)[0] == 1
    assert "SOURCE holds no images: manifest" in _error_line(capsys)
    assert not os.path.exists(root / "data" / "spans")

    write(source / "cat" / "a.jpg", images.rgb_jpeg())
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["published"]
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"] and "every image is already in a published span" in summary["message"]


def test_notifications_naming_only_sidecars_are_nothing_new(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    write(source / "cat" / "notes.txt")
    (tmp_path / "arrived").write_text(f"{source}/cat/notes.txt\n")
    code, summary = ingest(source, root, "--arrived", str(tmp_path / "arrived"), *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"]


@pytest.mark.parametrize("text,says", [
    ("path,label\nbad/path,cat\n", "its header path,label has no column uri"),
    ("uri,class\ncat/a.jpg,cat\n", "its header uri,class has no column label"),
    ("", "has no rows"),
])
def test_a_manifest_without_its_columns_is_one_line_naming_them(tmp_path, capsys, text, says):
    write(tmp_path / "cat" / "a.jpg", images.rgb_jpeg())
    (tmp_path / "m.csv").write_text(text)
    assert ingest(tmp_path / "m.csv", tmp_path / "root", *IN_MEMORY)[0] == 1
    line = _error_line(capsys)
    assert says in line and "uri,label[,split]" in line
