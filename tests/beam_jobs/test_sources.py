import json

import pytest

from beam_jobs.sources import identities, is_candidate, list_source, split_of
from components.contracts.results import SpanManifest
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


def test_identities_come_from_manifests():
    manifests = [SpanManifest(span=1, created="2026-01-01T00:00:00Z", source="/in", labels=["x"], shards=[],
                              counts={"train": 1, "eval": 0, "dead_letter": 0},
                              sources=[{"uri": "a", "size": 1, "version": "v"}])]
    assert identities(manifests) == {("a", 1, "v")}
