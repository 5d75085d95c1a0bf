"""Shards read in place are the files their manifests name: the size every time, the SHA-256 once for each file
as it is, and every way a published span's files change afterwards is caught and said in words."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import fsspec
import pytest

from components.common import shard_digests
from components.common.shard_digests import check
from components.common.spans import Spans
from components.common.tfrecord import frame
from components.contracts import schema
from components.contracts.layout import Root
from tests.components.conftest import TRAIN_LABELS, relabel, tiny_image, tiny_records, write_span

LATER = time.time() + 3600  # past the racy window of files written by the test


@pytest.fixture
def spans(tmp_path):
    """Two published spans of 3 and 2 GZIP train shards, and a cache folder of one's own."""
    root = str(tmp_path / "root")
    write_span(root, 1, {"train": tiny_records(12)}, TRAIN_LABELS, {"train": 3})
    write_span(root, 2, {"train": tiny_records(8, offset=100)}, TRAIN_LABELS, {"train": 2})
    return Root(root), str(tmp_path / "cache")


def _records(count: int, label: int) -> bytes:
    """`count` uncompressed records of one picture and `label`: the same size whatever the label."""
    image = tiny_image(0, 1)
    return b"".join(frame(schema.encode_example(encoded=image, image_format="jpeg", height=32, width=40, label=label,
                                                text=f"c{label}", source=f"mem://{i}")) for i in range(count))


def test_a_shard_is_hashed_once_then_known_by_its_identity(spans):
    root, cache = spans
    shards = Spans(root).shards("train")
    first = check(shards, cache, now=LATER)
    assert (first.mismatched, first.hashed, first.bytes_hashed) == ([], 5, sum(s.bytes for s in shards))
    again = check(shards, cache, now=LATER)
    assert (again.mismatched, again.hashed) == ([], 0)
    assert "0 hashed" in again.describe() and "5 known unchanged" in again.describe()


def test_a_file_written_moments_before_it_is_hashed_is_hashed_again(spans):
    """Its ctime is within the file system's timestamp granularity of the hashing: a write in the same tick
    would keep it, so its digest is not recorded."""
    root, cache = spans
    shards = Spans(root).shards("train")
    newest = max(os.stat(s.uri).st_ctime for s in shards)
    assert check(shards, cache, now=newest + 1).hashed == 5
    assert check(shards, cache, now=newest + 1).hashed == 5
    assert check(shards, cache, now=newest + shard_digests.RACY_SECONDS + 1).hashed == 5
    assert check(shards, cache, now=LATER).hashed == 0


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) * 2 // 3)


def _flip_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("change, damaged, why", [
    ("truncated", True, "is corrupt ("),
    ("a byte flipped", True, "is corrupt ("),
    ("rewritten with label 0", False, None),  # a size or record count of its own, or another digest
    ("removed", False, "is missing"),
])
def test_a_shard_changed_after_it_was_recorded_is_named(spans, change, damaged, why):
    root, cache = spans
    shards = Spans(root).shards("train", [1])
    assert check(shards, cache, now=LATER).hashed == 3  # recorded as published
    path = shards[1].uri
    mtime = os.stat(path).st_mtime_ns
    {"truncated": _truncate, "a byte flipped": _flip_byte, "removed": os.remove,
     "rewritten with label 0": lambda p: relabel(p, 0)}[change](path)
    if os.path.exists(path):
        os.utime(path, ns=(mtime, mtime))  # the old mtime back: the ctime still tells
    (found,) = check(shards, cache, now=LATER).mismatched
    assert found.shard == shards[1] and found.damaged is damaged
    assert why is None or found.why.startswith(why), found.why
    assert str(found).startswith(path)
    line = shard_digests.changed_spans([found])
    assert line.startswith("span 1 changed after it was published: ") and "restore the span's folder" in line


def test_a_shard_replaced_by_another_of_equal_size_is_changed(tmp_path):
    """Another span's shard of the very same size put in its place (records that read, just not these):
    the size passes, the SHA-256 does not."""
    import hashlib

    from components.contracts.layout import Shard

    published, other = _records(3, label=1), _records(3, label=2)
    assert len(published) == len(other) and published != other
    folder = tmp_path / "span-00001"
    folder.mkdir()
    (folder / "train-00000-of-00001.tfrecord").write_bytes(published)
    (tmp_path / "elsewhere.tfrecord").write_bytes(other)
    shard = Shard(str(folder / "train-00000-of-00001.tfrecord"), "", 3, 1, len(published),
                  hashlib.sha256(published).hexdigest())
    assert check([shard], str(tmp_path / "cache"), now=LATER).mismatched == []
    os.replace(tmp_path / "elsewhere.tfrecord", shard.uri)
    (found,) = check([shard], str(tmp_path / "cache"), now=LATER).mismatched
    assert (found.damaged, found.why) == (False, "is not the file its manifest's SHA-256 names")


def test_a_shard_the_manifest_does_not_name_is_not_read(spans):
    """A file dropped into a published span is no part of it: readers take the manifest's shards only."""
    root, cache = spans
    before = Spans(root).shards("train", [1])
    shutil.copy(before[0].uri, os.path.join(root.span(1), "train-00003-of-00004.tfrecord.gz"))
    assert Spans(root).shards("train", [1]) == before and check(before, cache, now=LATER).mismatched == []


def test_a_digest_of_another_manifest_is_not_taken_for_this_one(spans):
    """A recorded digest counts for the SHA-256 it matched: a shard whose manifest names another is hashed."""
    root, cache = spans
    shards = Spans(root).shards("train", [1])
    check(shards, cache, now=LATER)
    other = dataclasses.replace(shards[0], sha256="0" * 64)
    result = check([other], cache, now=LATER)
    assert result.hashed == 1 and result.mismatched[0].why == "is not the file its manifest's SHA-256 names"


def test_a_cache_folder_that_is_not_ones_own_records_nothing_and_every_shard_is_hashed(spans, tmp_path):
    root, _ = spans
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    shards = Spans(root).shards("train")
    first = check(shards, str(shared), now=LATER)
    assert first.hashed == 5 and "writable by others" in first.unrecorded and "--shard-cache-dir" in first.unrecorded
    assert check(shards, str(shared), now=LATER).hashed == 5 and os.listdir(shared) == []


def test_records_of_span_folders_unused_for_long_are_removed(spans):
    root, cache = spans
    check(Spans(root).shards("train", [1]), cache, now=LATER)
    digests = os.path.join(cache, shard_digests.DIGESTS)
    (old,) = os.listdir(digests)
    long_ago = time.time() - (shard_digests.KEEP_DAYS + 1) * 86400
    os.utime(os.path.join(digests, old), (long_ago, long_ago))
    check(Spans(root).shards("train", [2]), cache, now=LATER)
    assert old not in os.listdir(digests) and len(os.listdir(digests)) == 1
    assert check(Spans(root).shards("train", [1]), cache, now=LATER).hashed == 3  # hashed again, once


def test_a_record_file_of_another_folder_or_damaged_is_not_trusted(spans):
    root, cache = spans
    shards = Spans(root).shards("train", [1])
    check(shards, cache, now=LATER)
    digests = os.path.join(cache, shard_digests.DIGESTS)
    (name,) = os.listdir(digests)
    record = json.loads(open(os.path.join(digests, name)).read())
    with open(os.path.join(digests, name), "w") as f:
        json.dump({**record, "folder": "/elsewhere"}, f)
    assert check(shards, cache, now=LATER).hashed == 3
    with open(os.path.join(digests, name), "w") as f:
        f.write("{")
    assert check(shards, cache, now=LATER).hashed == 3


def test_in_a_store_the_objects_version_is_its_identity(s3_bucket, spans):
    """gs:// is read in place by TensorFlow; its objects, like S3's here, change version with every write."""
    root, cache = spans
    fs = fsspec.filesystem("s3")
    fs.put(root.span(1), f"{s3_bucket}/root/data/spans/span-00001", recursive=True)
    shards = Spans(f"s3://{s3_bucket}/root").shards("train", [1])
    assert check(shards, cache).hashed == 3 and check(shards, cache).hashed == 0
    fs.pipe_file(shards[0].uri, _flipped(fs.cat_file(shards[0].uri)))  # same size, new ETag
    result = check(shards, cache)
    assert result.hashed == 1 and result.mismatched[0].damaged


def _flipped(data: bytes) -> bytes:
    data = bytearray(data)
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


@pytest.mark.parametrize("change", ["rewritten with label 0", "a byte flipped", "truncated", "removed",
                                    "replaced by a copy of itself", "its mtime set back after a write"])
def test_a_watched_shard_changed_in_any_way_is_named_and_the_others_are_not(spans, change):
    """What a run reads is looked at again by identity alone (a stat): a file written, replaced, even by
    identical bytes, or removed since is no longer the file checked."""
    root, _ = spans
    shards = Spans(root).shards("train")
    watched = shard_digests.Watched(shards)
    assert watched.changed() == []
    path = shards[3].uri

    def copy_over(p):
        shutil.copy(p, p + ".new")
        os.replace(p + ".new", p)

    def set_back(p):
        mtime = os.stat(p).st_mtime_ns
        _flip_byte(p)
        _flip_byte(p)  # the same bytes again
        os.utime(p, ns=(mtime, mtime))

    {"rewritten with label 0": lambda p: relabel(p, 0), "a byte flipped": _flip_byte, "truncated": _truncate,
     "removed": os.remove, "replaced by a copy of itself": copy_over, "its mtime set back after a write": set_back,
     }[change](path)
    assert watched.changed() == [(shards[3], path)]
    line = watched.changed_while_read(watched.changed())
    assert "\n" not in line and line.startswith(f"span 2 changed while training read it: {path} is not the file ")
    assert "restore the span's folder" in line


def test_a_watched_copy_is_the_file_read_and_named_beside_its_shard(spans, tmp_path):
    """From a bucket, TensorFlow reads the shard cache's copies: those are watched, and named with their shard."""
    root, _ = spans
    shards = Spans(root).shards("train", [1])
    copies = [dataclasses.replace(s, uri=str(tmp_path / f"copy-{i}")) for i, s in enumerate(shards)]
    for shard, copy in zip(shards, copies):
        shutil.copy(shard.uri, copy.uri)
    watched = shard_digests.Watched(shards, copies)
    relabel(shards[0].uri, 0)  # the published file is not what is read
    assert watched.changed() == []
    relabel(copies[0].uri, 0)
    line = watched.changed_while_read(watched.changed())
    assert f"span 1 changed while training read it: {shards[0].uri} (its copy {copies[0].uri}) is not" in line
    assert line.endswith("train again: the shard cache copies a shard again when its copy fails its check")


def test_in_a_store_a_watched_objects_version_is_its_identity(s3_bucket, spans):
    root, _ = spans
    fs = fsspec.filesystem("s3")
    fs.put(root.span(1), f"{s3_bucket}/root/data/spans/span-00001", recursive=True)
    shards = Spans(f"s3://{s3_bucket}/root").shards("train", [1])
    watched = shard_digests.Watched(shards)
    assert watched.changed() == []
    fs.pipe_file(shards[1].uri, _flipped(fs.cat_file(shards[1].uri)))  # same size, new ETag
    assert [shard for shard, _ in watched.changed()] == [shards[1]]
