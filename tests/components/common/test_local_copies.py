"""Copies from a bucket (moto's S3 on 127.0.0.1) to a local folder stay inside it, whatever the keys say."""
from __future__ import annotations

import os
import uuid

import boto3
import pytest

from components.common import tf_files
from components.common.files import filesystem
from components.common.local_copies import Folder, UnsafeKey, copy_file, relative_parts
from components.push import predict

BACKUP = "runs/r1/backup"
GOOD = {f"{BACKUP}/checkpoint": b"pointer", f"{BACKUP}/chief/ckpt-1.index": b"index"}


@pytest.fixture
def put(s3_bucket):
    """Puts objects under a ROOT of their own in the test's bucket (its cases share one) and returns it."""
    client, root = boto3.client("s3"), uuid.uuid4().hex[:8]

    def put(keys: dict[str, bytes]) -> str:
        for key, data in keys.items():
            client.put_object(Bucket=s3_bucket, Key=f"{root}/{key}", Body=data)
        return f"s3://{s3_bucket}/{root}"

    return put


@pytest.fixture
def work(tmp_path):
    """A local folder with something in it already, and an `outside` that nothing may reach."""
    (tmp_path / "outside").mkdir()
    local = tmp_path / "deep" / "er" / "work" / "backup"
    local.mkdir(parents=True)
    (local / "kept").write_text("from before")
    return local


def _written(top) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), top) for d, _, files in os.walk(top) for f in files}


@pytest.mark.parametrize("bad", [
    f"{BACKUP}/../../../../../../x",  # climbs out
    f"{BACKUP}//etc/x",  # absolute below the folder: os.path.join would drop the folder
    f"{BACKUP}/a/b/../../../y",  # climbs out only after a few segments
    f"{BACKUP}/a/../b",  # stays inside once normalised, yet is no plain path either
    f"{BACKUP}/a\\..\\..\\z",  # another system's separator
    f"{BACKUP}/.",  # the folder itself
    f"{BACKUP}/./c",
    f"{BACKUP}/",  # a "folder marker" with content is a file named ''
])
def test_a_key_that_would_leave_the_folder_is_refused_before_anything_is_written(put, work, tmp_path, bad):
    root = put({**GOOD, bad: b"attacker"})
    with pytest.raises(UnsafeKey) as refused:
        tf_files.pull(f"{root}/{BACKUP}", str(work))
    message = str(refused.value)
    assert repr(bad)[1:-1] in message and "\n" not in message
    assert _written(tmp_path) == {"deep/er/work/backup/kept"}  # nothing written, nothing removed


def test_a_clean_backup_is_copied_whole_and_folder_markers_are_skipped(put, work):
    root = put({**GOOD, f"{BACKUP}/": b"", f"{BACKUP}/chief/": b""})
    assert tf_files.pull(f"{root}/{BACKUP}", str(work))
    assert _written(work) == {"checkpoint", "chief/ckpt-1.index"}  # made empty first, then copied
    assert (work / "chief" / "ckpt-1.index").read_bytes() == b"index"
    assert not tf_files.pull(f"{root}/runs/none/backup", str(work))


def test_percent_encoded_dots_are_plain_names_inside_the_folder(put, work, tmp_path):
    root = put({f"{BACKUP}/%2e%2e/%2e%2e/enc": b"literal"})  # fsspec passes them through undecoded
    assert tf_files.pull(f"{root}/{BACKUP}", str(work))
    assert _written(tmp_path) == {"deep/er/work/backup/%2e%2e/%2e%2e/enc"}


def test_a_link_in_place_of_the_folder_is_replaced_not_followed(put, work, tmp_path):
    root = put(GOOD)
    os.rename(work, tmp_path / "moved")
    os.symlink(tmp_path / "outside", work)  # the local backup folder is a link out
    assert tf_files.pull(f"{root}/{BACKUP}", str(work))
    assert not os.path.islink(work) and _written(work) == {"checkpoint", "chief/ckpt-1.index"}
    assert not os.listdir(tmp_path / "outside")


def test_links_inside_the_folder_are_replaced_not_followed(put, tmp_path):
    """A link where a copy goes, or where a folder on its way should be: the link goes, its target stays."""
    root = put({"model/variables/variables.index": b"index", "model/saved_model.pb": b"pb"})
    fs, _ = filesystem(root)
    local, outside = tmp_path / "scratch", tmp_path / "outside"
    local.mkdir(), outside.mkdir()
    (outside / "victim").write_bytes(b"untouched")
    os.symlink(outside, local / "variables")
    os.symlink(outside / "victim", local / "saved_model.pb")
    copy_file(fs, filesystem(f"{root}/model/variables/variables.index")[1], str(local), "variables/variables.index")
    copy_file(fs, filesystem(f"{root}/model/saved_model.pb")[1], str(local), "saved_model.pb")
    assert (local / "variables" / "variables.index").read_bytes() == b"index" and not os.path.islink(local / "variables")
    assert (local / "saved_model.pb").read_bytes() == b"pb" and not os.path.islink(local / "saved_model.pb")
    assert os.listdir(outside) == ["victim"] and (outside / "victim").read_bytes() == b"untouched"


@pytest.mark.parametrize("name", ["", ".", "..", "a/../../b", "/etc/passwd", "a//b", "nul\0", "back\\slash",
                                  "line\n/../../x"])
def test_names_a_copy_may_not_take(name):
    with pytest.raises(UnsafeKey) as refused:
        relative_parts(name, name)
    assert "\n" not in str(refused.value)  # one line, whatever the key holds


def test_predict_refuses_a_model_whose_keys_leave_its_folder_in_one_line(put, tmp_path, capsys):
    from tests.components.conftest import tiny_image

    root = put({"model/saved_model.pb": b"pb", "model/variables/../../../../escaped": b"attacker"})
    image = tmp_path / "cat.jpg"
    image.write_bytes(tiny_image(0, 0))
    assert predict.run([f"{root}/model", str(image)]) == 1
    err = capsys.readouterr().err.strip()
    assert "model/variables/../../../../escaped" in err and "\n" not in err and "refused" in err


@pytest.mark.parametrize("meanwhile", ["made the folder", "removed the link", "planted it again"])
def test_a_link_another_thread_replaces_at_the_same_time_is_replaced_once(tmp_path, monkeypatch, meanwhile):
    """The shard cache fetches on threads: two may find the same planted link and remove it at once. What the
    other did between our look and our unlink is played here at the exact moment it would happen."""
    outside, span = tmp_path / "outside", tmp_path / "span"
    outside.mkdir(), os.symlink(outside, span)
    unlink = os.unlink

    def other_thread_first(name, *, dir_fd=None):
        unlink(name, dir_fd=dir_fd)  # the other thread's unlink ...
        if meanwhile == "made the folder":
            os.mkdir(name, dir_fd=dir_fd)
        elif meanwhile == "planted it again":
            os.symlink(outside, name, dir_fd=dir_fd)
            return
        unlink(name, dir_fd=dir_fd)  # ... then ours, which finds a folder or nothing

    monkeypatch.setattr(os, "unlink", other_thread_first)
    if meanwhile == "planted it again":  # each time we remove it, it is back: refused, never followed
        with pytest.raises(OSError):
            Folder.open(str(tmp_path), ["span"], create=True)
    else:
        with Folder.open(str(tmp_path), ["span"], create=True) as folder:
            assert folder.path == str(span)
        assert span.is_dir() and not span.is_symlink()
    assert not os.listdir(outside)
