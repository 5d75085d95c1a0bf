"""Lines sorted on a local disk: a listing of millions of files is compared with the published spans
without ever being in memory whole.

Lines are taken in chunks of CHUNK, each sorted in memory and written to a file of its own; reading
merges the chunk files (heapq.merge holds one line of each). A run that fits in one chunk never
touches the disk. Strings sort by code point, the order every index under ROOT is written in.
"""
from __future__ import annotations

import heapq
import os
import tempfile
from collections.abc import Iterable, Iterator

CHUNK = 50_000  # lines held while sorting: some 10-20 MB of short lines


class SortedLines:
    """Lines added in any order, read back sorted as often as needed; a context manager that removes
    its chunk files on exit."""

    def __init__(self, lines: Iterable[str] = (), chunk: int | None = None):
        self._folder: tempfile.TemporaryDirectory | None = None
        self._chunks: list[str] = []
        self._pending: list[str] = []
        self._size = chunk or CHUNK
        self.count = 0
        for line in lines:
            self.add(line)

    def add(self, line: str) -> None:
        """One line, without newlines (escape them before)."""
        self._pending.append(line)
        self.count += 1
        if len(self._pending) >= self._size:
            self._spill()

    def __iter__(self) -> Iterator[str]:
        self._pending.sort()
        if not self._chunks:
            return iter(list(self._pending))
        return heapq.merge(*(read_lines(path) for path in self._chunks), iter(list(self._pending)))

    def _spill(self) -> None:
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="stoke-sort-")
        path = os.path.join(self._folder.name, f"{len(self._chunks):06d}")
        self._pending.sort()
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in self._pending)
        self._chunks.append(path)
        self._pending = []

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
            self._folder, self._chunks = None, []

    def __enter__(self) -> SortedLines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_lines(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line[:-1]
