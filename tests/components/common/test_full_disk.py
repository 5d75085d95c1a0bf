"""Writes onto a disk that is really full (tests/full_disk.py): the error names the file, and nothing is left
half-written, neither the file nor its temporary: what was there before stays, so the next run, once there
is space, starts from what the last good one left."""
from __future__ import annotations

import errno
import os

import pytest

from components.common import plots
from components.common.files import read_json, write_json
from components.contracts.layout import Root
from tests.components.report.test_words import SAMPLES
from tests.full_disk import small_disk


@pytest.fixture
def disk(tmp_path):
    with small_disk(tmp_path / "disk") as mounted:
        yield mounted


def _files(folder: str) -> dict[str, int]:
    return {os.path.relpath(os.path.join(top, name), folder): os.path.getsize(os.path.join(top, name))
            for top, _, names in os.walk(folder) for name in names}


def _full(error: OSError, path: str) -> None:
    assert error.errno == errno.ENOSPC and error.filename == path, (error, error.filename)


def test_a_file_written_whole_onto_a_full_disk_is_named_and_the_old_one_stays(disk):
    path = os.path.join(disk.path, "root", "runs", "r1", "config.json")
    write_json(path, {"epochs": 1})
    disk.fill()
    with pytest.raises(OSError) as raised:
        write_json(path, {"epochs": 2, "padding": "x" * 10_000})
    _full(raised.value, path)
    assert read_json(path) == {"epochs": 1} and os.listdir(os.path.dirname(path)) == ["config.json"]


def test_a_plot_onto_a_full_disk_is_named_and_leaves_no_half_of_it(disk):
    """A PNG goes through fsspec's file, whose failed write names no file."""
    path = os.path.join(disk.path, "root", "runs", "r1", "labels.png")
    disk.fill()
    figure, _ = plots.pyplot().subplots()
    with pytest.raises(OSError) as raised:
        plots.save(figure, path)
    _full(raised.value, path)
    assert os.listdir(os.path.dirname(path)) == []


def test_a_report_onto_a_full_disk_names_what_it_could_not_write_and_writes_no_half(disk):
    from components.report.report import write_report

    run = Root(os.path.join(disk.path, "root")).run("r1")
    for stage, name in (("gate", "gate.json"), ("train", "metrics.json")):
        write_json(run.result(stage), read_json(str(SAMPLES / name)))
    before = _files(run.uri)
    disk.fill()
    with pytest.raises(OSError) as raised:
        write_report(run, failed="train: the disk is full")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename.startswith(run.uri + "/"), raised.value
    assert _files(run.uri) == before
    disk.free()
    assert write_report(run, failed="train: the disk is full")["summary"]["status"] == "failed"
