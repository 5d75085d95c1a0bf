"""Files under ROOT on any file system fsspec knows (a local disk, s3://, gs://): JSON, results and
text written whole, which stores can rename atomically, and the one place that reads fsspec's
protocols and tells a URI from a local path."""
from __future__ import annotations

import json
import os
import posixpath
import stat
from contextlib import contextmanager

import fsspec

from components.contracts.paths import join as join  # the layout's own join, for every caller of this module

# No listing cache on object stores: a stage program, another run or an operator writes under ROOT
# while this process holds a listing of it, and s3fs and gcsfs would answer `ls` and `exists` from a
# listing taken before (a span published since would not be seen, a record written since not found).
for _protocol in ("s3", "s3a", "gs", "gcs"):
    fsspec.config.conf.setdefault(_protocol, {}).setdefault("use_listings_cache", False)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem behind a URI and the path within it."""
    return fsspec.core.url_to_fs(uri)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.exists(path)


def read_result(uri: str, model):
    """The result or record at `uri`, read through its model (components/contracts/results.py). A file that is
    not one (a folder, not JSON, not what the model says) is a ResultError naming it."""
    # Here, not at the top: Beam's image workers import this module, and the result models cost each of them
    # pydantic at every start.
    from components.contracts.results import ResultError, parse_json

    try:
        data = read_bytes(uri)
    except IsADirectoryError:
        raise ResultError(f"{uri} is a folder, not a file") from None
    return model.check(parse_json(data, uri), uri)


def read_json(uri: str):
    with fsspec.open(uri, "r", encoding="utf-8") as f:
        return json.load(f)


class NotASmallFile(ValueError):
    """A file named for what it holds (settings, options, a password) that is no regular file, or too big for one."""


def read_small(uri: str, limit: int, what: str = "such a file") -> bytes:
    """The bytes of a small file a person names (settings, options, a password): a regular file of at most
    `limit` bytes, or NotASmallFile naming it, before more than `limit` bytes are read. A FIFO would wait for
    a writer for good, /dev/zero never ends, and a huge file would be read whole into memory. `what` names
    the kind of file in the message: "a settings file"."""
    fs, path = filesystem(uri)
    if is_local(fs):
        return _read_small_local(uri, path, limit, what)
    info = fs.info(path)
    if info.get("type") != "file":
        raise NotASmallFile(f"{uri} is a folder, not {what}")
    if (info.get("size") or 0) > limit:
        raise NotASmallFile(f"{uri} is {info['size']:,} bytes, larger than {what} ({limit:,} at most)")
    data = fs.cat_file(path, start=0, end=limit + 1)
    if len(data) > limit:
        raise NotASmallFile(f"{uri} is larger than {what} ({limit:,} bytes at most)")
    return data


def _read_small_local(uri: str, path: str, limit: int, what: str) -> bytes:
    # O_NONBLOCK: opening a FIFO does not wait for a writer, so fstat can refuse it.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}
            kind = next((name for test, name in kinds.items() if test(status.st_mode)), "a device")
            raise NotASmallFile(f"{uri} is {kind}, not {what}: name a regular file")
        if status.st_size > limit:
            raise NotASmallFile(f"{uri} is {status.st_size:,} bytes, larger than {what} ({limit:,} at most)")
        chunks, size = [], 0
        while size <= limit:  # a file that grows as it is read (or under /proc, which says 0) stops here too
            chunk = os.read(descriptor, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    if size > limit:
        raise NotASmallFile(f"{uri} is larger than {what} ({limit:,} bytes at most)")
    return b"".join(chunks)


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    return fs.cat_file(path)


def write_json(uri: str, value) -> None:
    write_whole(uri, json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n")


def write_whole(uri: str, data: bytes) -> None:
    """Writes the file in one step: in one request on object stores; locally through a temp file and a
    rename, each synced to the disk first, so that a power cut leaves the old file or the new one, never an
    empty one, and a link at the name is replaced, never written through."""
    with writing(uri):
        _write_whole(uri, data)


def _write_whole(uri: str, data: bytes) -> None:
    fs, path = filesystem(uri)
    if is_local(fs):
        folder = posixpath.dirname(path)
        fs.makedirs(folder, exist_ok=True)
        tmp = f"{path}.tmp"
        # What holds that name is an old attempt's leftover: it goes, a link itself, and the new one is
        # made without following a link (one put there meanwhile fails), never written through one.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666),
                           "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:  # a full disk: no half of the new file stays beside the old one
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        descriptor = os.open(folder, os.O_RDONLY)  # the rename is an entry in the folder: sync it too
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    else:
        fs.pipe_file(path, data)


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode())


def write_bytes(uri: str, data: bytes) -> None:
    fs, path = filesystem(uri)
    with writing(uri):
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, data)


@contextmanager
def writing(uri: str):
    """fsspec's file objects raise the OSError of a failed write (a full disk) without the file's
    name, so the one error line a program prints would not say where: add it."""
    try:
        yield
    except OSError as error:
        if error.filename is None and error.filename2 is None and error.errno is not None:
            raise OSError(error.errno, error.strerror, uri) from error
        raise


def remove(uri: str) -> None:
    fs, path = filesystem(uri)
    fs.rm(path, recursive=True)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)  # fsspec allows either


def protocol(fs: fsspec.AbstractFileSystem) -> str:
    """The file system's own name for its scheme: "file", "s3", "gs", ..."""
    return _protocols(fs)[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """A local disk, where renames are atomic; object stores have none."""
    return "file" in _protocols(fs)


def uri_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A path on `fs` as its users spell it: a plain path on a local disk, `s3://...` elsewhere."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def version_of(info: dict) -> str:
    """What changes when a file's content does (fsspec's `info`): ETag on S3, generation on GCS, mtime locally."""
    for key in ("ETag", "etag", "generation", "mtime", "LastModified", "updated"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return ""


def is_uri(location: str) -> bool:
    """A location with a scheme (`s3://b/k`, `file:///x`), not a local path."""
    return "://" in location


def check_writable(uri: str) -> None:
    """Raises OSError naming `uri` when a local folder cannot be created or written (a read-only
    or full disk, wrong permissions), before a long stage spends its time and then fails to record it.
    Object stores are not probed: their writes fail with the store's own message."""
    fs, path = filesystem(uri)
    if not is_local(fs):
        return
    probe = os.path.join(path, f".stoke-write-probe-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from None
