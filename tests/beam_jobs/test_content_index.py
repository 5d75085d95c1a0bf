"""A span's content index is checked as it is read and rebuilt from the span's shards when it is
missing or damaged: exact copies never cross splits through a broken index, the rebuilt index is the
one ingest wrote, and a span whose shards are corrupt too is one line naming the shard."""
import gzip
import json
import os
import shutil
import zlib

import pytest

from beam_jobs.duplicates import find
from beam_jobs.ingest import ingest
from components.common import trusted_index
from components.common.content_index import BrokenIndex, read_index
from components.common.files import read_result
from components.common.tfrecord import frame
from components.contracts import schema
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.run_config import RunConfig
from components.datacheck.datacheck import content
from tests.beam_jobs import images
from tests.beam_jobs.test_content import photos
from tests.beam_jobs.test_ingest import IN_MEMORY

REENCODED = ["cmyk.jpg", "gray.jpg", "deep.png", "gray16.png", "alpha.png", "palette.gif", "plain.bmp",
             "scan.tiff", "photo.webp", "rotated.jpg"]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """One real ingest: records kept as they came, records re-encoded (other kinds, and photos shrunk
    by --max-side), in both splits; the index ingest wrote, as bytes."""
    base = tmp_path_factory.mktemp("content-index")
    source, root = base / "source", base / "root"
    photos(source, 8, "cat")
    (source / "dog").mkdir()
    for name in REENCODED:
        (source / "dog" / name).write_bytes(images.AWKWARD[name]())
    (source / "dog" / "large.jpg").write_bytes(images.photo_jpeg(320, 240))
    summary = ingest(RunConfig(source=str(source), root=str(root), ingest={"eval_fraction": 0.5, "max_side": 96}), IN_MEMORY,
                     progress=lambda event: None)
    assert summary.published and summary.counts.train and summary.counts.eval
    index = Root(str(root)).content_index(1)
    return {"source": source, "root": str(root), "index": open(index, "rb").read()}


def lines_of(data: bytes) -> list[str]:
    return gzip.decompress(data).decode().splitlines(keepends=True)


def copy_of(published, tmp_path) -> Root:
    shutil.copytree(published["root"], tmp_path / "root")
    return Root(str(tmp_path / "root"))


def copies(published) -> list[dict]:
    """Signatures of a re-upload of every published record under a new name, in the other split."""
    found = []
    for line in lines_of(published["index"]):
        sha, dhash, split, label, uri = line.rstrip("\n").split("\t")
        found.append({"sha256": sha, "dhash": dhash, "label": json.loads(label), "uri": f"s3://again/{sha[:8]}.jpg",
                      "split": "eval" if split == "train" else "train", "file": "x", "index": 0})
    return found


DAMAGE = {
    "reversed": lambda lines: "".join(lines[::-1]).encode(),
    "one line out of place": lambda lines: "".join(lines[:1] + lines[2:3] + lines[1:2] + lines[3:]).encode(),
    "a line twice": lambda lines: "".join(lines[:2] + lines[1:]).encode(),
    "a line lost": lambda lines: "".join(lines[:3] + lines[4:]).encode(),
    "a line added": lambda lines: "".join(lines + ["f" * 64 + "\t0000000000000000\ttrain\t\"cat\"\t\"s3://x\"\n"]).encode(),
    "a header that lies": lambda lines: "".join([f"# records {len(lines)}\n"] + lines[:-1]).encode(),
    "four fields": lambda lines: "".join(lines[:1] + [lines[1].rsplit("\t", 1)[0] + "\n"] + lines[2:]).encode(),
    "six fields": lambda lines: "".join(lines[:1] + [lines[1].rstrip("\n") + "\t\"x\"\n"] + lines[2:]).encode(),
    "a bad dhash": lambda lines: "".join(lines[:1] + [lines[1][:65] + "zz" + lines[1][67:]] + lines[2:]).encode(),
    "a split unknown": lambda lines: "".join(lines[:1] + [lines[1].replace("\ttrain\t", "\ttest\t").replace(
        "\teval\t", "\ttest\t")] + lines[2:]).encode(),
    "CRLF": lambda lines: "".join(line.replace("\n", "\r\n") for line in lines).encode(),
    "last line cut": lambda lines: "".join(lines).encode()[:-1],
    "no lines": lambda lines: b"",
}


def damage(path: str, how: str, good: bytes) -> None:
    if how == "missing":
        os.remove(path)
    elif how == "zero bytes":
        open(path, "wb").close()
    elif how == "cut gzip":
        open(path, "wb").write(good[:len(good) // 2])
    elif how == "gzip cut at its trailer":
        open(path, "wb").write(good[:-4])  # every line there, the length field gone
    elif how == "gzip CRC":
        data = bytearray(good)
        data[-8] ^= 0xFF  # the CRC32 of the uncompressed text
        open(path, "wb").write(bytes(data))
    elif how == "gzip then garbage":
        open(path, "wb").write(good + b"not gzip")
    elif how == "not gzip":
        open(path, "wb").write(gzip.decompress(good))
    else:
        open(path, "wb").write(gzip.compress(DAMAGE[how](lines_of(good))))


HOW = [*DAMAGE, "missing", "zero bytes", "cut gzip", "gzip cut at its trailer", "gzip CRC", "gzip then garbage", "not gzip"]


@pytest.mark.parametrize("how", HOW)
def test_read_index_refuses_every_damaged_index(published, tmp_path, how):
    root = copy_of(published, tmp_path)
    damage(root.content_index(1), how, published["index"])
    expected = len(lines_of(published["index"]))
    with pytest.raises(BrokenIndex) as refused:
        list(read_index(root.content_index(1), 1, expected))
    assert refused.value.number == 1 and str(refused.value).startswith(root.content_index(1))
    assert "\n" not in str(refused.value)


def test_the_index_ingest_wrote_passes_and_the_rebuilt_one_is_byte_for_byte_the_same(published, tmp_path, capsys):
    root = copy_of(published, tmp_path)
    good = lines_of(published["index"])
    assert len(list(read_index(root.content_index(1), 1, len(good)))) == len(good)
    os.remove(root.content_index(1))
    content(root, 1)
    assert open(root.content_index(1), "rb").read() == published["index"]
    warning = capsys.readouterr().err
    assert warning == (f"stoke: warning: {root.content_index(1)}: missing; rebuilt from the {len(good)} records of "
                       "span 1's shards\n")


@pytest.mark.parametrize("how", HOW)
def test_exact_copies_are_refused_whatever_the_damage_and_the_index_is_rebuilt(published, tmp_path, capsys, how):
    root = copy_of(published, tmp_path)
    damage(root.content_index(1), how, published["index"])
    found = find(copies(published), root)
    assert found.kept == [] and len(found.dropped) == len(lines_of(published["index"]))
    assert all(reason.startswith(f"duplicate of {published['source']}") and "(span 1, split " in reason
               for _, reason in found.dropped)
    assert open(root.content_index(1), "rb").read() == published["index"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stoke: warning: {root.content_index(1)}: ") and "rebuilt" in err


def test_the_data_check_reads_its_dhashes_through_the_same_check(published, tmp_path, capsys):
    root = copy_of(published, tmp_path)
    good = content(root, 1)
    damage(root.content_index(1), "reversed", published["index"])
    assert content(root, 1) == good and sum(map(len, good[0].values())) == len(lines_of(published["index"]))
    assert "rebuilt" in capsys.readouterr().err


def test_a_reencoded_record_whose_source_is_gone_is_indexed_by_its_stored_bytes_and_said_so(published, tmp_path,
                                                                                             capsys):
    """A record ingest re-encoded holds other bytes than its source: its SHA-256 comes from the source
    file while that still has its published size and version; without it, from the stored bytes."""
    root = copy_of(published, tmp_path)
    gone, changed = published["source"] / "dog" / "cmyk.jpg", published["source"] / "dog" / "alpha.png"
    shutil.move(gone, tmp_path / "cmyk.jpg")
    shutil.copy2(changed, tmp_path / "alpha.png")  # copy2 keeps the mtime: the version, for local files
    changed.write_bytes(changed.read_bytes() + b"\0")  # another version of the same picture
    try:
        os.remove(root.content_index(1))
        content(root, 1)
    finally:
        shutil.move(tmp_path / "cmyk.jpg", gone)
        shutil.copy2(tmp_path / "alpha.png", changed)
    rebuilt, good = lines_of(open(root.content_index(1), "rb").read()), lines_of(published["index"])
    differ = sorted(set(rebuilt) ^ set(good))
    assert len(rebuilt) == len(good) and len(differ) == 4, differ  # two lines, each with another SHA-256
    assert sorted(json.loads(line.split("\t")[4]).rsplit("/", 1)[1] for line in differ) == \
        ["alpha.png", "alpha.png", "cmyk.jpg", "cmyk.jpg"]
    assert {line.split("\t")[1] for line in differ if "cmyk" in line} != set()  # a dHash still, for near-duplicates
    assert "(2 of them from their stored bytes alone" in capsys.readouterr().err


def test_a_root_that_cannot_be_written_keeps_the_rebuilt_index_for_the_run(published, tmp_path, capsys):
    root = copy_of(published, tmp_path)
    os.remove(root.content_index(1))
    os.mkdir(root.content_index(1))  # where the index goes, something the rebuild cannot replace
    found = find(copies(published), root)
    assert found.kept == [] and os.path.isdir(root.content_index(1))
    assert "kept for this run in " in capsys.readouterr().err


def test_a_rebuilt_index_that_fails_again_is_one_line(published, tmp_path, monkeypatch):
    root = copy_of(published, tmp_path)
    damage(root.content_index(1), "reversed", published["index"])
    monkeypatch.setattr(trusted_index, "write_index",
                        lambda uri, kept: open(uri, "wb").write(gzip.compress(b"garbage\n")))
    with pytest.raises(BrokenIndex, match="line 1 is not an index line"):
        find(copies(published), root)


def shard_of(root: Root, split: str = "eval") -> str:
    manifest = read_result(root.manifest(1), SpanManifest)
    return os.path.join(root.span(1), next(s.file for s in manifest.shards if s.split == split))


def records_of(path: str) -> list[bytes]:
    from components.common.tfrecord import read_records

    with gzip.open(path) as f:
        return list(read_records(f))


def rewrite(path: str, records: list[bytes]) -> None:
    with gzip.open(path, "wb") as f:
        f.write(b"".join(frame(record) for record in records))


def break_shard(path: str, how: str) -> None:
    data = open(path, "rb").read()
    records = records_of(path)
    if how == "cut":
        open(path, "wb").write(data[:len(data) // 2])
    elif how == "missing":
        os.remove(path)
    elif how == "a record fails its CRC":
        framed = bytearray(b"".join(frame(record) for record in records))
        framed[20] ^= 0xFF
        open(path, "wb").write(gzip.compress(bytes(framed)))
    elif how == "a record short":
        rewrite(path, records[:-1])
    elif how == "not a tf.Example":
        rewrite(path, [b"\x0a\xff garbage"] + records[1:])
    elif how == "no image":
        rewrite(path, [schema.encode_example(encoded=b"not an image", image_format="jpeg", height=1, width=1, label=0,
                                             text="cat", source="s3://x/y.jpg")] + records[1:])
    elif how == "not gzip":
        open(path, "wb").write(zlib.compress(data))


@pytest.mark.parametrize("how", ["cut", "missing", "a record fails its CRC", "a record short", "not a tf.Example",
                                 "no image", "not gzip"])
def test_a_broken_index_of_a_span_whose_shards_are_corrupt_is_one_line_naming_the_shard(published, tmp_path, how):
    root = copy_of(published, tmp_path)
    damage(root.content_index(1), "cut gzip", published["index"])
    shard = shard_of(root)
    break_shard(shard, how)
    with pytest.raises(ResultError) as refused:
        find(copies(published), root)
    message = str(refused.value)
    assert message.startswith(f"{root.content_index(1)} cannot be rebuilt: ") and shard in message, message
    assert "\n" not in message and not isinstance(refused.value, BrokenIndex)
    assert open(root.content_index(1), "rb").read() != published["index"]  # nothing half-written in its place


def test_spans_published_before_content_indexes_are_checked_too(published, tmp_path, capsys):
    """A span of 0.1 has no content index: copies of its images were let in; now it is built."""
    root = copy_of(published, tmp_path)
    os.remove(root.content_index(1))
    assert find(copies(published), root).kept == []
    assert os.path.exists(root.content_index(1)) and ": missing; rebuilt" in capsys.readouterr().err


def test_an_unsorted_index_no_longer_hides_a_copy_from_the_merge(published, tmp_path):
    """The merge steps through both sorted lists: reversed, it passes every hash but the last."""
    root = copy_of(published, tmp_path)
    damage(root.content_index(1), "reversed", published["index"])
    one = copies(published)[:1]  # the smallest SHA-256 of the span
    assert find(one, root).kept == []
    new = {**one[0], "sha256": "0" * 64, "uri": "s3://again/new.jpg"}  # and a new picture still gets in
    assert [s["uri"] for s in find([new], root).kept] == ["s3://again/new.jpg"]
