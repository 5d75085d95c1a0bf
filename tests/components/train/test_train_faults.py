"""`stoke train` on a ROOT it cannot write: one error line naming the run folder, before training.
Tests run as root, which writes through permissions: tests/components/faults.py's read_only()
makes Python's writes under ROOT raise OSError(EROFS), the way a read-only mount does."""
from __future__ import annotations

import json
import os

from components.train import trainer
from tests.components.faults import read_only
from tests.components.gate_runs import TINY


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
