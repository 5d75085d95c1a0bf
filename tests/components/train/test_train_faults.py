"""`stoke train` on a ROOT it cannot write: one error line naming the run folder, before training.
Tests run as root, which writes through permissions: tests/components/faults.py's read_only()
makes Python's writes under ROOT raise OSError(EROFS), the way a read-only mount does. A disk that
fills while it trains is a real one (tests/full_disk.py)."""
from __future__ import annotations

import json
import os
import shutil

from components.train import trainer
from tests.components.faults import read_only
from tests.components.gate_runs import TINY
from tests.full_disk import small_disk


def test_a_read_only_root_is_one_line_naming_the_run_folder(small_spans_root, capsys, monkeypatch):
    read_only(monkeypatch, small_spans_root)
    code = trainer.run(["--root", small_spans_root, "--run-id", "ro", *TINY, "--epochs", "1", "--json"])
    captured = capsys.readouterr()
    run = os.path.join(small_spans_root, "runs", "ro")
    assert code == 1, captured.err
    assert captured.err == f"stoke train: error: {run} cannot be written: read-only file system\n", captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["error"].startswith(run)
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(run, "metrics.json"))


def test_a_disk_that_fills_as_the_candidate_is_exported_is_one_line_and_the_same_run_finishes_later(
        small_spans_root, tmp_path, capsys, monkeypatch):
    """TensorFlow's SavedModel writer says a full disk as its own ResourceExhaustedError: one line naming the file,
    no metrics.json (the run is not done), and the same run id, once there is space, trains to its end."""
    with small_disk(tmp_path / "disk") as disk:
        root, export = os.path.join(disk.path, "root"), trainer.export_candidate
        shutil.copytree(small_spans_root, root)

        def full_first(**kwargs):
            disk.fill()
            return export(**kwargs)

        argv = ["--root", root, "--run-id", "night", *TINY, "--epochs", "1", "--json"]
        with monkeypatch.context() as patch:
            patch.setattr(trainer, "export_candidate", full_first)
            code = trainer.run(argv)
        captured = capsys.readouterr()
        run = os.path.join(root, "runs", "night")
        last = captured.err.strip().splitlines()[-1]  # after training's own lines
        assert code == 1 and "Traceback" not in captured.err, captured.err
        assert last.startswith(f"stoke train: error: {run}/candidate/"), last
        assert last.endswith(" cannot be written: no space left on device"), last
        assert not os.path.exists(os.path.join(run, "metrics.json"))
        disk.free()
        assert trainer.run(argv) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"] == "night"
