import json

import pytest

from beam_jobs.sources import is_candidate, list_source, split_of
from tests.beam_jobs import images


def write(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_folder_labels_come_from_first_level_folders(tmp_path):
    write(tmp_path / "cat" / "a.jpg")
    write(tmp_path / "cat" / "deeper" / "still" / "b.png")
    write(tmp_path / "dog" / "c.JPEG")
    write(tmp_path / "dog" / "notes.txt")  # sidecar: ignored
    write(tmp_path / "dog" / ".hidden.jpg")  # hidden: ignored
    write(tmp_path / ".cache" / "d.jpg")  # hidden folder: ignored
    write(tmp_path / "stray.jpg")  # no class folder: rejected with a reason
    listing = list_source(str(tmp_path), eval_fraction=0.0)
    assert sorted((s.key, s.label, s.split) for s in listing.sources) == [
        ("cat/a.jpg", "cat", "train"), ("cat/deeper/still/b.png", "cat", "train"), ("dog/c.JPEG", "dog", "train")]
    assert [(s.uri, reason) for s, reason in listing.rejected] == [
        (str(tmp_path / "stray.jpg"), "not inside a class folder, so it has no label")]
    assert all(s.size == 1 and s.version for s in listing.sources)


def test_candidates():
    assert is_candidate("a/b.webp") and is_candidate("a/B.TIFF")
    assert not is_candidate("a/b.json") and not is_candidate("a/.b.jpg") and not is_candidate(".git/x.png")


def test_split_is_deterministic_and_close_to_the_fraction():
    keys = [f"class/{i}.jpg" for i in range(4000)]
    splits = [split_of(k, 0.1) for k in keys]
    assert splits == [split_of(k, 0.1) for k in keys]
    assert 0.08 < splits.count("eval") / len(keys) < 0.12
    assert {split_of(k, 0.0) for k in keys} == {"train"}


def test_csv_manifest_with_relative_paths_and_splits(tmp_path):
    write(tmp_path / "img" / "a.jpg")
    write(tmp_path / "img" / "b.jpg")
    write(tmp_path / "img" / "c.jpg")
    (tmp_path / "m.csv").write_text(
        "uri,label,split\nimg/a.jpg,cat,eval\nimg/b.jpg,dog,\nimg/missing.jpg,dog,train\n"
        "img/c.jpg,,train\nimg/a.jpg,cat,eval\nimg/b.jpg,dog,holdout\n")
    listing = list_source(str(tmp_path / "m.csv"), eval_fraction=0.0)
    assert [(s.uri.rsplit("/", 1)[-1], s.label, s.split) for s in listing.sources] == [
        ("a.jpg", "cat", "eval"), ("b.jpg", "dog", "train")]
    reasons = {s.uri.rsplit("/", 1)[-1]: r for s, r in listing.rejected}
    assert reasons == {"missing.jpg": "not found", "c.jpg": "manifest row has no label"}


def test_jsonl_manifest(tmp_path):
    write(tmp_path / "a.png", images.rgb_png())
    (tmp_path / "m.jsonl").write_text(json.dumps({"uri": str(tmp_path / "a.png"), "label": "x"}) + "\n")
    listing = list_source(str(tmp_path / "m.jsonl"), eval_fraction=0.1)
    assert [(s.uri, s.label) for s in listing.sources] == [(str(tmp_path / "a.png"), "x")]


def test_a_missing_source_or_unknown_kind_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_source(str(tmp_path / "nope"), 0.1)
    write(tmp_path / "list.txt")
    with pytest.raises(ValueError, match="neither a folder nor"):
        list_source(str(tmp_path / "list.txt"), 0.1)


def test_manifest_rows_outside_its_folder_or_on_other_schemes_are_refused(tmp_path):
    folder = tmp_path / "photos"
    write(folder / "img" / "a.png")
    write(tmp_path / "secret.png")  # beside the manifest's folder, not in it
    rows = ["img/a.png", f"file://{folder}/img/a.png", "../secret.png", str(tmp_path / "secret.png"),
            f"file://{tmp_path}/secret.png", "img/../../secret.png", "http://127.0.0.1:9/x.png",
            "ftp://example.com/x.png"]
    (folder / "m.csv").write_text("".join(f"{row},cat\n" for row in rows))

    listing = list_source(str(folder / "m.csv"), eval_fraction=0.0)
    assert [s.uri for s in listing.sources] == [str(folder / "img" / "a.png")]
    outside = f"outside the manifest's folder {folder}; --allow-outside-source reads it"
    assert {s.uri: r for s, r in listing.rejected} == {
        str(tmp_path / "secret.png"): outside,
        "http://127.0.0.1:9/x.png": "scheme http:// is not read: local paths, s3:// and gs:// only",
        "ftp://example.com/x.png": "scheme ftp:// is not read: local paths, s3:// and gs:// only",
    }
    assert all(s.size == 0 and s.version == "" for s, _ in listing.rejected)  # refused rows are never read

    allowed = list_source(str(folder / "m.csv"), eval_fraction=0.0, allow_outside=True)
    assert [s.uri for s in allowed.sources] == [str(folder / "img" / "a.png"), str(tmp_path / "secret.png")]
    assert {s.uri: r for s, r in allowed.rejected} == {
        "http://127.0.0.1:9/x.png": "scheme http:// is not read: local paths, s3:// and gs:// only",
        "ftp://example.com/x.png": "scheme ftp:// is not read: local paths, s3:// and gs:// only"}


def test_spellings_of_one_path_are_one_source_with_one_split(tmp_path):
    write(tmp_path / "a.png")
    write(tmp_path / "img" / "b.png")
    spellings = ["a.png", "./a.png", "img/../a.png", "img//../a.png", str(tmp_path / "a.png"), f"file://{tmp_path}/a.png",
                 "img/./b.png", "./img/b.png"]
    (tmp_path / "m.csv").write_text("".join(f"{s},cat\n" for s in spellings))
    listing = list_source(str(tmp_path / "m.csv"), eval_fraction=0.5)
    assert [(s.uri, s.key) for s in listing.sources] == [(str(tmp_path / "a.png"), "a.png"),
                                                         (str(tmp_path / "img" / "b.png"), "img/b.png")]
    assert [s.split for s in listing.sources] == [split_of("a.png", 0.5), split_of("img/b.png", 0.5)]
    assert listing.rejected == []


# ---------------------------------------------------------------- a manifest's columns


def _rows(tmp_path, text: str, name: str = "m.csv"):
    write(tmp_path / "img" / "a.png")
    write(tmp_path / "img" / "b.png")
    (tmp_path / name).write_text(text)
    listing = list_source(str(tmp_path / name), eval_fraction=0.0)
    return [(s.key, s.label, s.split) for s in listing.sources], [r for _, r in listing.rejected]


@pytest.mark.parametrize("header", ["uri,label", "URI, Label", "label,uri", " uri ,label,split", "split,label,uri"])
def test_a_header_names_the_columns_in_any_order(tmp_path, header):
    order = [name.strip().lower() for name in header.split(",")]
    row = {"uri": "img/a.png", "label": "cat", "split": "eval"}
    sources, rejected = _rows(tmp_path, f"{header}\n{','.join(row[name] for name in order)}\n")
    assert sources == [("img/a.png", "cat", "eval" if "split" in order else "train")] and rejected == []


def test_a_csv_without_a_header_is_read_by_position(tmp_path):
    sources, rejected = _rows(tmp_path, "img/a.png,cat\nimg/b.png,dog,eval\n")
    assert sources == [("img/a.png", "cat", "train"), ("img/b.png", "dog", "eval")] and rejected == []


@pytest.mark.parametrize("header,wrong", [
    ("path,label", "has no column uri and the unknown column path"),
    ("uri,class", "has no column label and the unknown column class"),
    ("filename,class", "has no column uri, label and the unknown columns filename, class"),
    ("uri,label,weight", "has the unknown column weight"),
    ("uri,label,uri", "has uri twice"),
    ("image", "has no column uri, label and the unknown column image"),
])
def test_a_header_without_the_columns_is_refused_naming_them(tmp_path, header, wrong):
    write(tmp_path / "img" / "a.png")
    (tmp_path / "m.csv").write_text(f"{header}\nimg/a.png,cat\n")
    with pytest.raises(ValueError) as refused:
        list_source(str(tmp_path / "m.csv"), 0.0)
    assert str(refused.value) == (f"manifest {tmp_path / 'm.csv'}: its header {header} {wrong}; a manifest's columns are "
                                  "uri,label[,split]: a first row naming them, in any order, or no header and the columns "
                                  "in that order")


@pytest.mark.parametrize("text", ["", "\n\n  \n", "uri,label\n", "\ufeffuri,label,split\n\n"])
def test_a_manifest_without_rows_is_refused(tmp_path, text):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(ValueError, match=f"^SOURCE holds no images: manifest {tmp_path / 'm.csv'} has no rows"):
        list_source(str(tmp_path / "m.csv"), 0.0)


def test_a_row_with_more_cells_than_columns_is_a_dead_letter(tmp_path):
    sources, rejected = _rows(tmp_path, "uri,label\nimg/a.png,cat,eval\nimg/b.png,dog,\n")
    assert sources == [("img/b.png", "dog", "train")]
    assert rejected == ["manifest line 2 has 3 cells; its columns are uri,label"]


def test_jsonl_keys_are_the_columns(tmp_path):
    lines = [{"uri": "img/a.png", "label": "cat"}, {"uri": "img/b.png", "label": "dog", "weight": 2}]
    sources, rejected = _rows(tmp_path, "".join(json.dumps(line) + "\n" for line in lines), "m.jsonl")
    assert sources == [("img/a.png", "cat", "train")]
    assert rejected == ["manifest row has the unknown key weight; its keys are uri,label[,split]"]
    (tmp_path / "p.jsonl").write_text(json.dumps({"path": "img/a.png", "label": "cat"}) + "\n")
    with pytest.raises(ValueError, match="its first row's keys path,label has no column uri and the unknown column path"):
        list_source(str(tmp_path / "p.jsonl"), 0.0)


def test_a_source_it_may_not_read_is_refused_not_listed_as_a_dead_letter(tmp_path, monkeypatch):
    """Tests run as root, which reads through permissions: the folder's listing is refused here as it
    is for another user (tests/flows/test_one_line_errors.py does it for real)."""
    import os

    write(tmp_path / "cat" / "a.png")
    real = os.scandir

    def scandir(path="."):
        if str(path) == str(tmp_path):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PermissionError, match=f"^source {tmp_path} cannot be read: permission denied$"):
        list_source(str(tmp_path), 0.0)
