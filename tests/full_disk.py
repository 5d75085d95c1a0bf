"""A disk that really fills: a small tmpfs mounted for one test, filled to its last byte by a file beside what
the test keeps on it, and emptied again. Its writes fail as a full disk's do, in Python, in TensorFlow's C++ file
system and in the stage programs a test starts: ENOSPC from write() or close(), after open() succeeded. Mounting
needs root (or CAP_SYS_ADMIN); where it is not permitted the test is skipped."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

FILLER = ".filler"


class Disk:
    """The tmpfs at `path`; `fill()` takes its last byte, `free()` gives the space back."""

    def __init__(self, path: str):
        self.path = path
        self.filler = os.path.join(path, FILLER)

    def fill(self, room: int = 0) -> None:
        """Takes every page but `room` bytes (whole pages)."""
        with open(self.filler, "ab", buffering=0) as f:
            for size in (1 << 20, 1 << 12, 1):  # then what a page has left
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError:
                    pass
            f.truncate(f.tell() - room)
        assert os.statvfs(self.path).f_bavail * os.statvfs(self.path).f_frsize == room

    def free(self) -> None:
        os.remove(self.filler)


@contextmanager
def small_disk(path, size_mb: int = 32) -> Iterator[Disk]:
    """A tmpfs of `size_mb` mounted at `path` (made if missing) for the block, unmounted after it."""
    path = str(path)
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", path], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"a tmpfs cannot be mounted here ({mounted.stderr.strip()}): no disk to fill")
    try:
        yield Disk(path)
    finally:
        subprocess.run(["umount", "--lazy", path], check=True)
