"""Preflight looks at SOURCE first: a path that does not exist, a folder without images, a manifest without
its columns fail the check with the fix, and the machine's checks are not run; a store that does not
answer fails it as transient within its timeout. (Every store case runs for real against moto in
tests/flows/test_one_line_errors.py, through `stoke preflight`.)"""
from __future__ import annotations

import json
import os
import socket

import pytest

from components.preflight import preflight
from components.preflight.source import HEAD_BYTES, WALK_LIMIT, source_check


def write(path, data: bytes = b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_folder_with_an_image_in_a_class_folder_passes(tmp_path):
    write(tmp_path / ".cache" / "x.png")
    write(tmp_path / "cat" / "deeper" / "0.JPG")
    check = source_check(str(tmp_path))
    assert (check.name, check.status) == ("source", "ok")


@pytest.mark.parametrize("made,says", [
    ("missing", "{source} does not exist"),
    ("empty", "SOURCE holds no images: {source} has no image files"),
    ("sidecars", "SOURCE holds no images: {source} has no image files"),
    ("a text file", "{source} is neither a folder nor a .csv/.jsonl manifest"),
    ("path,label", "its header path,label has no column uri and the unknown column path"),
    ("uri,class", "its header uri,class has no column label"),
    ("an empty CSV", "SOURCE holds no images: manifest {source} has no rows"),
    ("a header alone", "SOURCE holds no images: manifest {source} has no rows"),
    ("a JSONL of path", "its first row's keys path,label has no column uri"),
])
def test_a_source_ingest_cannot_read_fails_the_check_with_the_fix(tmp_path, made, says):
    folder = tmp_path / "photos"
    files = {"a text file": ("list.txt", "cat/0.png\n"), "path,label": ("m.csv", "path,label\ncat/0.png,cat\n"),
             "uri,class": ("m.csv", "uri,class\ncat/0.png,cat\n"), "an empty CSV": ("m.csv", ""),
             "a header alone": ("m.csv", "uri,label\n"), "a JSONL of path": ("m.jsonl", '{"path": "a.png", "label": "x"}\n')}
    if made in files:
        name, text = files[made]
        source = write(folder / name, text.encode())
    else:
        source = folder
        if made != "missing":
            folder.mkdir()
        if made == "sidecars":
            for sidecar in ("cat/notes.txt", "cat/.0.png", ".cache/1.png"):
                write(folder / sidecar)
    check = source_check(str(source))
    assert check.status == "fail" and says.format(source=source) in check.summary, check.summary
    assert check.fix and check.facts["transient"] is False


def test_a_manifest_is_judged_by_its_start_and_a_long_first_row_left_to_ingest(tmp_path):
    rows = "".join(f"cat/{i}.png,cat\n" for i in range(HEAD_BYTES // 10))  # longer than what preflight reads
    assert source_check(str(write(tmp_path / "m.csv", f"uri,label\n{rows}".encode()))).status == "ok"
    cut = write(tmp_path / "long.csv", ("x" * (2 * HEAD_BYTES) + ",cat\n").encode())
    assert source_check(str(cut)).status == "ok"  # its first row is cut: ingest reads it whole


def test_a_folder_of_many_sidecars_before_its_images_is_not_judged_empty(tmp_path):
    for i in range(WALK_LIMIT + 10):
        write(tmp_path / "a-sidecars" / f"{i}.txt")
    write(tmp_path / "b-cat" / "0.png")
    check = source_check(str(tmp_path))
    assert check.status == "ok" and "is a folder that can be read (no image among its first" in check.summary


def test_preflight_stops_at_a_source_it_cannot_read(tmp_path, capfd):
    report = preflight.run_checks(str(tmp_path / "root"), source=str(tmp_path / "photso"), sample_mb=1)
    assert [c.name for c in report.checks] == ["source"] and report.status == "fail"  # no TensorFlow, no disks
    assert preflight.run(["--source", str(tmp_path / "photso"), "--root", str(tmp_path / "root"), "--json"]) == 1
    captured = capfd.readouterr()
    assert captured.err == (f"stoke preflight: source failed: {tmp_path / 'photso'} does not exist (fix: check the path: "
                            "SOURCE is a folder of class subfolders, or a .csv/.jsonl manifest of uri,label[,split])\n")
    assert json.loads(captured.out.strip().splitlines()[-1])["failed"] == ["source"]


def test_a_store_that_does_not_answer_fails_the_check_as_transient(monkeypatch):
    """A listener on 127.0.0.1 that takes the connection and never answers, as a blackholed endpoint does."""
    import s3fs

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}",
                            "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
            monkeypatch.setenv(name, value)
        s3fs.S3FileSystem.clear_instance_cache()  # a cached file system would hold another endpoint
        try:
            check = source_check("s3://silent/photos", timeout=1)
        finally:
            s3fs.S3FileSystem.clear_instance_cache()  # nor may a later test get this one
    assert check.status == "fail" and check.summary == "s3://silent/photos did not answer within 1 s"
    assert check.facts["transient"] and "AWS_ENDPOINT_URL" in check.fix
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
