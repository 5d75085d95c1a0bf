"""One file, one identity: however SOURCE, a manifest or a row spells a path, and wherever a link points."""
import os

from beam_jobs.compare import compare
from beam_jobs.sources import list_source
from components.common.files import read_json, write_json
from components.contracts import schema
from components.contracts.layout import MANIFEST, Root
from components.contracts.results import SpanManifest
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest, records
from tests.beam_jobs.test_sources import write


def test_every_spelling_of_a_folder_source_is_one_dataset(tmp_path, capsys, monkeypatch):
    source, root = tmp_path / "SRC", tmp_path / "root"
    for i in range(3):
        write(source / "cat" / f"{i}.jpg", images.rgb_jpeg(seed=i))
    os.symlink(source, tmp_path / "link")
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    monkeypatch.chdir(tmp_path)
    for spelling in (f"{source}//", f"{source}/../SRC", "./SRC", "SRC/", str(tmp_path / "link"),
                     f"{tmp_path}//link/", f"file://{source}"):
        code, summary = ingest(spelling, root, *IN_MEMORY, capsys=capsys)
        assert code == 0 and not summary["published"] and "nothing new" in summary["message"], spelling


def test_spans_published_under_another_spelling_still_count_as_known(tmp_path):
    write(tmp_path / "SRC" / "cat" / "a.jpg")
    os.symlink(tmp_path / "SRC", tmp_path / "link")
    [listed] = list_source(str(tmp_path / "link"), 0.0).sources
    assert listed.uri == str(tmp_path / "SRC" / "cat" / "a.jpg")
    spellings = (f"{tmp_path}/link/cat/a.jpg", f"{tmp_path}/SRC/./cat/a.jpg", f"file://{tmp_path}/link/cat/a.jpg")
    for number, spelled in enumerate(spellings, start=1):
        root = Root(str(tmp_path / f"root-{number}"))
        write_json(root.manifest(1), SpanManifest(span=1, created="2026-01-01T00:00:00Z", source="x", labels=["cat"], shards=[],
                     counts={"train": 1, "eval": 0, "dead_letter": 0, "duplicates": 0},
                     sources=[{"uri": spelled, "size": listed.size, "version": listed.version}]).to_json())
        assert compare([(listed, None)], root).fresh == [], spelled


def test_fsspec_chaining_in_rows_and_sources_is_refused(tmp_path):
    write(tmp_path / "img" / "a.png", images.rgb_png())
    rows = [f"img/a.png::{i}" for i in range(30)] + [f"{tmp_path}/img/a.png::x", f"file://{tmp_path}/img/a.png::y",
                                                     f"zip://a.png::file://{tmp_path}/img/a.png"]
    (tmp_path / "m.csv").write_text("".join(f"{row},cat\n" for row in rows))
    listing = list_source(str(tmp_path / "m.csv"), 0.5)
    assert listing.sources == []
    assert len(listing.rejected) == len(rows)
    assert {reason for _, reason in listing.rejected} == {"'::' (fsspec's chaining) is not read: name one file"}
    for source in (f"{tmp_path}/m.csv::x", f"{tmp_path}::y"):
        try:
            list_source(source, 0.5)
        except ValueError as error:
            assert "'::' (fsspec's chaining) is not read" in str(error)
        else:
            raise AssertionError(source)


def test_a_file_named_with_colons_is_read_as_itself(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    write(source / "cat" / "a.png", images.rgb_png(seed=1))
    write(source / "cat" / "a.png::b.png", images.rgb_png(seed=2))  # fsspec would read a.png
    code, summary = ingest(source, root, "--eval-fraction", "0", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] == 2 and summary["duplicates"] == 0
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    by_name = {os.path.basename(r[schema.SOURCE]): r["pixels"] for r in records(root, manifest)}
    assert (by_name["a.png::b.png"] == images.pixels(seed=2)).all()


def test_a_manifest_spelled_with_double_slashes_or_through_a_link_reads_its_rows(tmp_path):
    write(tmp_path / "data" / "img" / "a.png")
    (tmp_path / "data" / "m.csv").write_text("img/a.png,cat\n")
    os.symlink(tmp_path / "data", tmp_path / "link")
    for spelled in (f"{tmp_path}//data//m.csv", f"{tmp_path}/link/m.csv", f"{tmp_path}/data/../data/m.csv"):
        listing = list_source(spelled, 0.0)
        assert [s.uri for s in listing.sources] == [str(tmp_path / "data" / "img" / "a.png")], spelled
        assert listing.rejected == []


def test_links_out_of_the_source_are_dead_letters_unless_allowed(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    write(source / "cat" / "in.jpg", images.rgb_jpeg(seed=1))
    write(tmp_path / "secret" / "s.jpg", images.rgb_jpeg(seed=2))
    os.symlink(tmp_path / "secret" / "s.jpg", source / "cat" / "s.jpg")
    os.symlink(tmp_path / "secret", source / "dog")
    os.symlink(source / "cat" / "in.jpg", source / "cat" / "also.jpg")  # inside: fine
    listing = list_source(str(source), 0.0)
    assert sorted(s.key for s in listing.sources) == ["cat/also.jpg", "cat/in.jpg"]
    outside = f"outside the source {source} (a link points there); --allow-outside-source reads it"
    assert sorted((s.uri, r) for s, r in listing.rejected) == [
        (str(source / "cat" / "s.jpg"), outside), (str(source / "dog"), outside)]
    allowed = list_source(str(source), 0.0, allow_outside=True)
    assert sorted(s.key for s in allowed.sources) == ["cat/also.jpg", "cat/in.jpg", "cat/s.jpg", "dog/s.jpg"]

    (source / "m.csv").write_text("cat/in.jpg,cat\ncat/s.jpg,cat\ndog/s.jpg,dog\n")
    rows = list_source(str(source / "m.csv"), 0.0)
    assert [s.uri for s in rows.sources] == [str(source / "cat" / "in.jpg")]
    assert {s.uri for s, _ in rows.rejected} == {str(tmp_path / "secret" / "s.jpg")}

    code, summary = ingest(source, root, "--max-bad-fraction", "1", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["dead_letter"] == 3  # two links out, one copy of in.jpg
    assert {d["reason"] for d in dead_letters(root, 1)} >= {outside}


def test_a_source_whose_path_holds_pattern_characters_is_read_as_it_is(tmp_path, capsys):
    """SOURCE is listed and read by name, never matched as a pattern (ROOT may not hold these: TensorFlow loads
    models from it), so a neighbour the pattern would match is not read."""
    source, root = tmp_path / "photos[1]*?\\", tmp_path / "root"
    write(source / "cat" / "a[1].png", images.rgb_png(seed=1))
    write(source / "cat" / "b*?.png", images.rgb_png(seed=2))
    write(tmp_path / "photos1" / "cat" / "c.png", images.rgb_png(seed=3))
    code, summary = ingest(source, root, "--eval-fraction", "0", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"] == {**summary["counts"], "train": 2, "dead_letter": 0}
    manifest = read_json(os.path.join(summary["span_uri"], MANIFEST))
    assert sorted(os.path.basename(r[schema.SOURCE]) for r in records(root, manifest)) == ["a[1].png", "b*?.png"]
