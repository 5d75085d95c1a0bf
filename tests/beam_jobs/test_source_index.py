"""Each span's sorted source index: written at publish, built from the manifest where it is missing or
damaged, and merged against a listing sorted on disk, with the answer a plain set difference gives."""
import gzip
import os
import random

import pytest

from beam_jobs import compare as compare_module
from beam_jobs import spill
from beam_jobs.compare import compare
from beam_jobs.ingest import ingest as run_ingest
from beam_jobs.source_index import HEADER, identity, read_source_index
from beam_jobs.sources import Source, list_source
from components.common.files import read_result, write_json
from components.contracts.layout import Root
from components.contracts.results import SpanManifest
from components.contracts.run_config import RunConfig
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, ingest
from tests.beam_jobs.test_sources import write

# URIs whose JSON spellings sort against each other in every awkward way: prefixes, a tab, a
# newline, a quote, a backslash, non-ASCII.
AWKWARD = ["s3://b/a", "s3://b/a b", "s3://b/a/b", "s3://b/a\tb", "s3://b/a\nb", 's3://b/a"b', "s3://b/a\\b",
           "s3://b/é", "s3://b/a-", "s3://b/a.png", "s3://b/A"]


def publish(root: Root, number: int, sources: list[tuple[str, int, str]]) -> None:
    manifest = SpanManifest(span=number, created="2026-01-01T00:00:00Z", source="s3://b", labels=["x"], shards=[],
                            counts={"train": len(sources), "eval": 0, "dead_letter": 0, "duplicates": 0},
                            sources=[{"uri": u, "size": s, "version": v} for u, s, v in sources])
    write_json(root.manifest(number), manifest.to_json())


def index_lines(root: Root, number: int) -> list[str]:
    return list(read_source_index(root.source_index(number), number))


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """One real ingest: a span whose index ingest wrote."""
    folder = tmp_path_factory.mktemp("ingested")
    source, root = folder / "source", folder / "root"
    for i in range(6):
        write(source / ("cat" if i % 2 else "dog") / f"{i}.png", images.rgb_png(seed=i))
    (source / "dog" / "bad.png").write_bytes(b"not a png")
    config = RunConfig(source=str(source), root=str(root), ingest={"max_bad_fraction": 0.5})
    summary = run_ingest(config, IN_MEMORY, progress=lambda event: None)
    assert summary.span == 1
    return source, Root(str(root))


def test_ingest_writes_the_index_of_every_source_it_publishes(ingested):
    source, root = ingested
    manifest = read_result(root.manifest(1), SpanManifest)
    assert len(manifest.sources) == 7  # the bad file is a source of the span too, as a dead letter
    assert index_lines(root, 1) == sorted(identity(s.uri, s.size, s.version) for s in manifest.sources)
    with gzip.open(root.source_index(1), "rt") as f:
        assert f.readline() == f"{HEADER}7\n"
    listed = list_source(str(source), 0.0)
    assert compare(listed.entries(), root).fresh == [] and compare(listed.entries(), root).refused == []


def damage(path: str, how: str) -> None:
    data = open(path, "rb").read()
    if how == "missing":
        os.remove(path)
    elif how == "cut":
        open(path, "wb").write(data[:len(data) // 2])
    elif how == "empty":
        open(path, "wb").write(b"")
    elif how == "lines lost":  # a whole, valid gzip file that ends early: only the count tells
        lines = gzip.decompress(data).decode().splitlines(keepends=True)
        open(path, "wb").write(gzip.compress("".join(lines[:-2]).encode()))
    elif how == "unsorted":
        lines = gzip.decompress(data).decode().splitlines(keepends=True)
        open(path, "wb").write(gzip.compress("".join(lines[:1] + lines[1:][::-1]).encode()))
    elif how == "not gzip":
        open(path, "wb").write(b"# sources 3\nplain text\n")


@pytest.mark.parametrize("how", ["missing", "cut", "empty", "lines lost", "unsorted", "not gzip"])
def test_a_missing_or_damaged_index_is_rebuilt_from_the_manifest(tmp_path, how, capsys):
    root = Root(str(tmp_path / "root"))
    published = [(f"s3://b/{i:03d}.png", i, f"v{i}") for i in range(40)]
    publish(root, 1, published[:20])
    publish(root, 2, published[20:])
    listed = [(Source(u, s, v, "x"), None) for u, s, v in published] + [(Source("s3://b/new.png", 1, "v"), None)]
    assert [s.uri for s in compare(listed, root).fresh] == ["s3://b/new.png"]  # spans of before: built
    capsys.readouterr()
    good = open(root.source_index(2), "rb").read()
    damage(root.source_index(2), how)
    assert [s.uri for s in compare(listed, root).fresh] == ["s3://b/new.png"]
    assert open(root.source_index(2), "rb").read() == good  # stored again, whole
    err = capsys.readouterr().err  # and said so, naming the file
    assert err.count("\n") == 1 and err.startswith(f"stoke: warning: {root.source_index(2)}: ") and \
        err.endswith("; rebuilt from span 2's manifest\n"), err


def test_an_index_that_cannot_be_stored_is_kept_for_the_run(tmp_path):
    root = Root(str(tmp_path / "root"))
    publish(root, 1, [("s3://b/a.png", 1, "v")])
    os.mkdir(root.source_index(1))  # where the index goes, something this run cannot replace
    listed = [(Source("s3://b/a.png", 1, "v"), None), (Source("s3://b/b.png", 1, "v"), None)]
    assert [s.uri for s in compare(listed, root).fresh] == ["s3://b/b.png"]
    assert os.path.isdir(root.source_index(1))


def test_a_span_that_named_files_with_their_signatures_knows_them_by_name(tmp_path, capsys):
    """A span published when a row's query was part of its name: its index (rebuilt without the query) and
    the listing, which names files without it, agree; a key's `?` and a manifest row's `#rowN` are names."""
    root = Root(str(tmp_path / "root"))
    signed = [("http://h/a.png?hmac=S1", 1, "v"), ("http://u:p@h/b.png#access_token=S2", 2, "v"),
              ("s3://b/c?versionId=3", 3, "v"), ("http://h/m.csv#row4", 0, "")]
    publish(root, 1, signed)
    with gzip.open(root.source_index(1), "wt") as f:  # as ingest wrote it then: the names as they were
        f.write(f"{HEADER}{len(signed)}\n" + "".join(sorted(
            f'"{u}"\t{s}\t"{v}"\n' for u, s, v in signed)))
    listed = [(Source("http://h/a.png", 1, "v", query="?hmac=NEW"), None), (Source("http://u:***@h/b.png", 2, "v"), None),
              (Source("s3://b/c?versionId=3", 3, "v"), None), (Source("http://h/m.csv#row4", 0, ""), "bad row"),
              (Source("http://h/m.csv#row5", 0, ""), "bad row")]
    assert [s.uri for s, _ in compare(listed, root).refused] == ["http://h/m.csv#row5"]
    assert compare(listed, root).fresh == []
    assert "S1" not in gzip.open(root.source_index(1), "rt").read()
    assert capsys.readouterr().err.startswith(f"stoke: warning: {root.source_index(1)}: line ")


def test_a_broken_manifest_behind_a_missing_index_is_one_line_naming_it(tmp_path):
    root = Root(str(tmp_path / "root"))
    os.makedirs(root.span(1))
    open(root.manifest(1), "w").write("{not json")
    with pytest.raises(ValueError, match=r"_MANIFEST.json is not JSON"):
        compare([(Source("s3://b/a.png", 1, "v"), None)], root)


def test_the_streamed_merge_gives_the_set_difference(tmp_path, monkeypatch):
    """Many spans merged two at a time, a listing spilled in chunks of 7, awkward URIs: new, refused
    and touched exactly."""
    monkeypatch.setattr(spill, "CHUNK", 7)
    monkeypatch.setattr(compare_module, "FAN_IN", 2)
    rng = random.Random(3)
    uris = AWKWARD + [f"s3://b/c{i % 10}/{i}.png" for i in range(150)]
    published = [(u, rng.randint(1, 3), f"v{rng.randint(1, 2)}") for u in uris if rng.random() < 0.7]
    published += [(u, s + 1, v) for u, s, v in published[:10]]  # an older version of the same URI
    root = Root(str(tmp_path / "root"))
    for number in range(1, 6):
        publish(root, number, published[number - 1::5])
    listed = [(Source(u, rng.randint(1, 3), f"v{rng.randint(1, 2)}", "x", "train", u), None) for u in uris]
    listed += [(Source(f"s3://b/refused/{i}", 0, ""), "not found") for i in range(5)]
    publish(root, 6, [("s3://b/refused/0", 0, "")])
    found = compare(listed, root)
    held = {(u, s, v) for u, s, v in published} | {("s3://b/refused/0", 0, "")}
    assert sorted(found.fresh, key=repr) == sorted((s for s, r in listed if r is None and s.identity not in held), key=repr)
    assert sorted(s.uri for s, _ in found.refused) == [f"s3://b/refused/{i}" for i in range(1, 5)]
    sizes = {(u, s) for u, s, _ in published}
    assert sorted(found.touched, key=repr) == sorted((s for s in found.fresh if (s.uri, s.size) in sizes), key=repr)
    assert found.touched and found.fresh


def test_a_span_published_before_indexes_existed_is_known_to_ingest(ingested, tmp_path, capsys):
    """An old span (no index) is built from its manifest: a rerun publishes nothing, new files do."""
    source, root = ingested
    os.remove(root.source_index(1))
    code, summary = ingest(source, root.uri, *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"] and "nothing new" in summary["message"]
    assert os.path.exists(root.source_index(1))


def test_a_whole_index_is_what_is_read_not_the_manifest(tmp_path):
    root = Root(str(tmp_path / "root"))
    publish(root, 1, [("s3://b/a.png", 1, "v")])
    listed = [(Source("s3://b/a.png", 1, "v"), None)]
    assert compare(listed, root).fresh == []
    publish(root, 1, [])  # the manifest no longer names the file; the index it was built from does
    assert compare(listed, root).fresh == []
    os.remove(root.source_index(1))
    assert [s.uri for s in compare(listed, root).fresh] == ["s3://b/a.png"]
