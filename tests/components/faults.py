"""Fault drills for disks the tests cannot really break: they run as root, which writes through
permissions, and a full or read-only disk cannot be made for one test. `read_only` makes every
write under a folder raise OSError(EROFS) (or `err`); Python-level writes only (builtins.open,
os.open, os.mkdir/makedirs, rename/replace, remove/unlink/rmdir), not TensorFlow's C++ file system."""
from __future__ import annotations

import builtins
import errno
import os

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _under(folder: str, path, dir_fd=None) -> bool:
    if isinstance(path, int):
        return False
    path = os.fsdecode(path)
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    path = os.path.abspath(path)
    return path == folder or path.startswith(folder + os.sep)


def read_only(monkeypatch, folder: str, err: int = errno.EROFS) -> None:
    """Every write under `folder` raises OSError(err) naming the path, as on a read-only disk."""
    folder = os.path.abspath(folder)

    def refuse(path):
        raise OSError(err, os.strerror(err), os.fsdecode(path))

    def guard(name: str, writes=lambda *a, **k: True):
        real = getattr(os, name)

        def guarded(path, *args, **kwargs):
            if writes(path, *args, **kwargs) and _under(folder, path, kwargs.get("dir_fd")):
                refuse(path)
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, guarded)

    for name in ("mkdir", "remove", "unlink", "rmdir", "rename", "replace"):
        guard(name)
    guard("open", lambda path, flags, *a, **k: bool(flags & _WRITE_FLAGS))
    real_makedirs, real_open = os.makedirs, builtins.open

    def makedirs(path, mode=0o777, exist_ok=False):
        if _under(folder, path) and not os.path.isdir(path):
            refuse(path)
        return real_makedirs(path, mode, exist_ok)

    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and _under(folder, file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    monkeypatch.setattr(builtins, "open", open_)
