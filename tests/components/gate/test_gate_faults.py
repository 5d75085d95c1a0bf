"""`stoke gate` on a truncated eval shard or a read-only ROOT: one error line naming the shard or
the path, never a traceback."""
from __future__ import annotations

import json
import os

import pytest

from components.contracts.layout import Root
from tests.components.faults import read_only
from tests.components.gate_runs import copy_root, gate_scenario


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


def _gate(root: str, capsys) -> tuple[int, str, dict]:
    from components.gate import gate as validate

    code = validate.run(["--root", root, "--run-id", "good", "--json"])
    captured = capsys.readouterr()
    return code, captured.err, json.loads(captured.out.strip().splitlines()[-1])


def _truncate(shard_uri: str) -> None:
    size = os.path.getsize(shard_uri)
    with open(shard_uri, "r+b") as f:
        f.truncate(size * 2 // 3)


def test_a_truncated_eval_shard_is_named_in_one_line(trained_runs, tmp_path, capsys):
    root = copy_root(trained_runs, tmp_path)
    shard = Root(root).shards("eval", [1])[0].uri
    _truncate(shard)
    code, err, summary = _gate(root, capsys)
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("stoke gate: error: corrupt eval shard: ") and shard in err, err
    assert "Traceback" not in err and shard in summary["error"]


def test_a_shard_that_breaks_inside_tfma_is_named_too(trained_runs, tmp_path, capsys, monkeypatch):
    """The label scan passes (it read the shard before the damage), so TFMA, inside Beam, hits it."""
    from components.gate import gate as validate

    root = copy_root(trained_runs, tmp_path)
    shards = Root(root).shards("eval", [1])
    scanned = validate._scan_eval(shards, 4)
    monkeypatch.setattr(validate, "_scan_eval", lambda _shards, _keep: scanned)
    _truncate(shards[0].uri)
    code, err, _ = _gate(root, capsys)
    assert code == 1 and err.count("\n") == 1 and shards[0].uri in err and "Traceback" not in err, err


def test_a_read_only_root_is_one_line_naming_the_path(trained_runs, tmp_path, capsys, monkeypatch):
    """Tests run as root, which writes anywhere: read_only() makes every write under ROOT raise EROFS.
    The gate finds out before TFMA runs, not when it writes its results."""
    root = copy_root(trained_runs, tmp_path)
    read_only(monkeypatch, root)
    code, err, summary = _gate(root, capsys)
    assert code == 1, err
    run = os.path.join(root, "runs", "good")
    assert err == f"stoke gate: error: {run} cannot be written: read-only file system\n", err
    assert summary["error"] == f"{run} cannot be written: read-only file system"
