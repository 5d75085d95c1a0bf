"""Local sources by their real paths: one file has one URI however SOURCE was spelled.

`SRC`, `SRC//`, `./SRC`, `SRC/../SRC` and a symlink to SRC are one folder, so the files below it get
one URI each (their real path) and a second ingest finds nothing new. A link inside the source is
followed, and what it points at must be inside the source too, as a manifest row must be. Paths are
taken literally: `::` in a file's name is part of the name, never fsspec's chaining.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from functools import lru_cache

import fsspec

from components.common.files import is_uri
from components.contracts.secrets import SourceCredentials

CHAINING = "::"  # fsspec reads `a::b` as "a, through b": never on a source's or a row's say-so
LOCAL_SCHEMES = ("file", "local")
NOT_REGULAR = "not a regular file (a FIFO, socket or device): never opened"


class NotRegularFile(OSError):
    """A source that is no longer a regular file when it is opened; the message is the reason."""


TOO_LONG = "path longer than the system allows (PATH_MAX 4096): nothing below this folder is read"
NOT_UTF8 = "file name is not valid UTF-8 (shown with \\x escapes): rename it to ingest it"


def shown(path: str) -> str:
    """A path as text: bytes that are not UTF-8 (os gives them as surrogates) as \\x escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def local_path(location: str) -> str | None:
    """The real, absolute path of a local location (a plain path or file://); None for a bucket."""
    scheme, has_scheme, rest = location.partition("://")
    if has_scheme and scheme.lower() not in LOCAL_SCHEMES:
        return None
    return os.path.realpath(rest if has_scheme else location)


def canonical(uri: str) -> str:
    """What a published or listed URI names, for telling known files from new ones: local paths by
    their real path, so spans published under another spelling of SOURCE keep matching."""
    if is_uri(uri) and uri.partition("://")[0].lower() not in LOCAL_SCHEMES:
        return uri
    path = uri.partition("://")[2] if is_uri(uri) else uri
    if not path.startswith("/"):
        return uri  # not a path that listing makes
    real = os.path.join(_real_folder(os.path.dirname(path)), os.path.basename(path))
    return os.path.realpath(real) if os.path.islink(real) else real


@lru_cache(maxsize=65536)
def _real_folder(folder: str) -> str:
    return os.path.realpath(folder)


def inside(path: str, folder: str) -> bool:
    """`path` is `folder` or below it; both real paths."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def outside_reason(folder: str) -> str:
    return f"outside the source {folder} (a link points there); --allow-outside-source reads it"


def walk(base: str, allow_outside: bool, wanted) -> Iterator[tuple[str, str | None, os.stat_result | str]]:
    """Files below the real folder `base` whose relative path `wanted` accepts, as (path, relative,
    stat), and the entries refused, as (path, None, reason), one folder at a time: a listing of
    millions of files is never held whole. Linked folders are followed once each."""
    refused, seen = [], {base}

    def failed(error: OSError) -> None:
        too_long = error.errno == errno.ENAMETOOLONG
        refused.append((shown(error.filename or base), None,
                        TOO_LONG if too_long else f"cannot be listed: {error.strerror}"))

    for folder, dirs, files in os.walk(base, onerror=failed, followlinks=True):
        yield from refused
        refused.clear()
        keep = []
        for name in sorted(dirs):
            path = os.path.join(folder, name)
            target = os.path.realpath(path)
            if name.startswith(".") or target in seen:
                continue  # hidden, or a folder already listed (a second link to it, a loop)
            if not allow_outside and not inside(target, base):
                yield shown(path), None, outside_reason(base)
                continue
            seen.add(target)
            keep.append(name)
        dirs[:] = keep
        for name in sorted(files):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, base)
            if wanted(relative):
                entry = _file(path, base, allow_outside)
                yield (shown(path), None, entry) if isinstance(entry, str) else (path, relative, entry)
    yield from refused


def _file(path: str, base: str, allow_outside: bool) -> os.stat_result | str:
    """The file's status, or why it is refused: a FIFO or device is never opened (a read could
    wait forever), a name that is not UTF-8 could not be recorded."""
    if shown(path) != path:
        return NOT_UTF8
    if os.path.islink(path) and not allow_outside and not inside(os.path.realpath(path), base):
        return outside_reason(base)
    try:
        status = os.stat(path)
    except OSError as error:
        return f"cannot be read: {error.strerror}"
    return status if stat.S_ISREG(status.st_mode) else NOT_REGULAR


def open_source(uri: str):
    """A source file for reading: a local path literally (a name may hold `::`), a URI through fsspec,
    with the credentials SOURCE was given with (a listed file is named without them: beam_jobs/sources.py).
    A local file that became a FIFO or device after listing is refused without blocking."""
    if is_uri(uri):
        return fsspec.open(SourceCredentials.of_workers().reveal(uri)).open()
    descriptor = os.open(uri, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise NotRegularFile(NOT_REGULAR)
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")
