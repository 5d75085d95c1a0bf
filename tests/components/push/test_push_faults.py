"""`stoke push` and `stoke rollback` on a ROOT they cannot write (read-only, permission denied) or
a disk that fills mid-push: one error line naming the path, nothing half-published, and the next
push succeeds. Tests run as root, which writes through permissions, so the faults are drills:
tests/components/faults.py makes Python's writes under ROOT raise, and a full disk is a copy that
raises ENOSPC."""
from __future__ import annotations

import errno
import os
import shutil

import fsspec.implementations.local as local_fs
import pytest

from components.common.repository import Repository
from components.push import rollback
from tests.components.faults import read_only
from tests.components.gate_runs import copy_root, gate_scenario, listing, push_run


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


def _before_third_push(trained_runs, tmp_path) -> str:
    """A copy of ROOT where run `mixed` is blessed but not pushed yet."""
    root = copy_root(trained_runs, tmp_path)
    shutil.rmtree(os.path.join(root, "models", "stoke", str(trained_runs["push"]["mixed"][1]["version"])))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    return root


def _one_line(capsys, prog: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES])
def test_push_to_a_root_it_cannot_write_is_one_line_and_publishes_nothing(trained_runs, tmp_path, capsys,
                                                                          monkeypatch, err):
    root = _before_third_push(trained_runs, tmp_path)
    before = listing(root)
    read_only(monkeypatch, root, err)
    code, summary = push_run(root, "mixed", "--no-build-image")
    line = _one_line(capsys, "stoke push")
    assert code == 1 and "cannot be written" in line and root in line, line
    assert summary["pushed"] is False and "cannot be written" in summary["error"]
    monkeypatch.undo()
    assert listing(root) == before
    assert not os.path.exists(os.path.join(root, "runs", "mixed", "pushed.json"))
    code, pushed = push_run(root, "mixed", "--no-build-image")  # writable again: the push goes through
    assert code == 0 and pushed["pushed"], pushed


def test_rollback_on_a_read_only_root_is_one_line_and_moves_nothing(trained_runs, tmp_path, capsys, monkeypatch):
    root = copy_root(trained_runs, tmp_path)
    before = listing(root)
    read_only(monkeypatch, root)
    assert rollback.run(["--root", root, "--json"]) == 1
    line = _one_line(capsys, "stoke rollback")
    assert "cannot be written: read-only file system" in line and root in line, line
    monkeypatch.undo()
    assert listing(root) == before and Repository(root, "stoke").rolled_back() == []


def _disk_fills(monkeypatch, repo_path: str, after: int = 1, cleanup_fails: bool = False) -> None:
    """Drill: the copy into the repository raises ENOSPC once `after` files are in, as a full disk
    does; with `cleanup_fails`, removing the partial copy fails too."""
    copied = []
    real_copy, real_rm = local_fs.LocalFileSystem.cp_file, local_fs.LocalFileSystem.rm

    def cp_file(self, path1, path2, **kwargs):
        if str(path2).startswith(repo_path) and len(copied) >= after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path2))
        copied.append(path2)
        return real_copy(self, path1, path2, **kwargs)

    def rm(self, path, *args, **kwargs):
        if cleanup_fails and ".push-" in str(path):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
        return real_rm(self, path, *args, **kwargs)

    monkeypatch.setattr(local_fs.LocalFileSystem, "cp_file", cp_file)
    monkeypatch.setattr(local_fs.LocalFileSystem, "rm", rm)


@pytest.mark.parametrize("cleanup_fails", [False, True])
def test_a_disk_that_fills_mid_push_is_one_line_and_the_next_push_succeeds(trained_runs, tmp_path, capsys,
                                                                           monkeypatch, cleanup_fails):
    root = _before_third_push(trained_runs, tmp_path)
    repo = Repository(root, "stoke")
    before = repo.versions()
    _disk_fills(monkeypatch, repo.path, cleanup_fails=cleanup_fails)
    code, summary = push_run(root, "mixed", "--no-build-image")
    line = _one_line(capsys, "stoke push")
    assert code == 1 and "cannot be written: no space left on device" in line and repo.path in line, line
    assert summary["pushed"] is False
    monkeypatch.undo()
    names = os.listdir(repo.path)
    assert repo.versions() == before and not [n for n in names if n.isdigit() and int(n) not in before]
    assert any(n.startswith(".push-") for n in names) == cleanup_fails  # left only when removing it failed
    assert not os.path.exists(os.path.join(root, "runs", "mixed", "pushed.json"))
    code, pushed = push_run(root, "mixed", "--no-build-image")  # space again: the push goes through
    assert code == 0 and pushed["pushed"] and repo.versions() == before + [pushed["version"]], pushed
    assert bool(pushed["cleaned_partial"]) == cleanup_fails
    assert not any(n.startswith(".push-") for n in os.listdir(repo.path))
