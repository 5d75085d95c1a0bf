"""Copies from a store into a local folder that stay inside it: the one way Stoke brings a store's files
to a local disk (training's backup, the models the gate and predict load, the shard cache's copies).

A store takes any string as a key, so the part of a key below the folder being copied is checked before
anything is written: a relative path of plain names, none of them empty, `.` or `..`, and without a
backslash (a separator elsewhere) or NUL. Any other key is refused with UnsafeKey, which names it. The
local side is walked one folder at a time from the destination down with O_NOFOLLOW, so a symbolic link
already inside it (planted, or left by anything) is replaced, never followed. Each file is fetched by
fsspec's own get_file (its retries, its ranged downloads) into a private folder made for it alone (mode
0700, created exclusively and reached through its descriptor), then renamed into place: a reader never
sees half a file, and a copy that fails (a full disk) leaves nothing behind.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat

DATA = "data"  # the file's name inside its private folder while it is fetched
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeKey(ValueError):
    """A key in a store that names no file inside the local folder it would be copied to."""


def relative_parts(rel: str, key: str) -> list[str]:
    """The names of `rel` (a key's part below the folder copied, `key` in full for the message), or UnsafeKey."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") or "\\" in part or "\0" in part for part in parts):
        raise UnsafeKey(f"{key!r} in the store is no plain path below the folder being copied (no empty, '.' or "
                        "'..' part, no backslash), so its copy could land outside the local folder: refused")
    return parts


def below(key: str, prefix: str) -> list[str]:
    """The names of `key` below the store folder `prefix`, checked (UnsafeKey)."""
    head = prefix.rstrip("/") + "/"
    if not key.startswith(head):
        raise UnsafeKey(f"{key!r} in the store is not below {prefix!r}, the folder being copied; refused")
    return relative_parts(key[len(head):], key)


def copy_tree(fs, remote: str, local: str) -> int:
    """Copies every file under the store folder `remote` into `local` (made empty first) and returns
    how many; every key is checked before anything is written or removed."""
    files = [(key, below(key, remote)) for key, info in sorted(fs.find(remote, detail=True).items())
             if not (key.endswith("/") and not info.get("size"))]  # an empty key ending in '/' marks a folder
    clear(local)
    os.makedirs(local, exist_ok=True)
    for key, parts in files:
        with Folder.open(local, parts[:-1], create=True) as folder:
            folder.fetch(fs, key, parts[-1])
    return len(files)


def copy_file(fs, remote: str, local: str, name: str) -> str:
    """Copies the store file `remote` to `local/name` (`local` is created when missing); returns its path."""
    parts = relative_parts(name, name)
    os.makedirs(local, exist_ok=True)
    with Folder.open(local, parts[:-1], create=True) as folder:
        folder.fetch(fs, remote, parts[-1])
    return os.path.join(local, *parts)


def clear(local: str) -> None:
    """Removes `local`: a symbolic link itself, never what it points to; a folder with everything in it."""
    try:
        mode = os.lstat(local).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(local)  # walks with O_NOFOLLOW: links inside are removed, not followed
    else:
        os.unlink(local)


class Folder:
    """A folder below a local root, reached without following a symbolic link below the root: its files
    are read and written through the folder's descriptor, by name."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    @classmethod
    def open(cls, root: str, parts: list[str], create: bool) -> Folder | None:
        """The folder `root/parts...`. With `create`, missing folders are made and a symbolic link or
        file in the way is replaced by a folder; without, None when the way is not all real folders."""
        fd = os.open(root, _FOLDER)
        path = root
        try:
            for part in parts:
                relative_parts(part, part)
                child = _open_child(fd, part, create, os.path.join(path, part))
                os.close(fd)
                fd, path = child, os.path.join(path, part)
                if fd is None:
                    return None
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return cls(fd, path)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def reader(self, name: str):
        """`name` opened for reading, or FileNotFoundError; a symbolic link raises OSError (ELOOP)."""
        return os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd), "rb")

    def sha256(self, name: str) -> str:
        with self.reader(name) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    def fetch(self, fs, remote: str, name: str, box: str | None = None, check=None, keep_failed=False) -> str | None:
        """Copies the store file `remote` to `name` here: fsspec writes it into `box`, a private folder
        made here for it (default: a fresh name), from which it is renamed over `name` (a link there is
        replaced, not followed) unless `check(box_folder, DATA)` returns what is wrong, which is returned
        (with `keep_failed`, the copy takes its place all the same). The box goes whatever happens."""
        box = box or f".stoke-fetch-{os.getpid()}-{os.urandom(4).hex()}"
        os.mkdir(box, 0o700, dir_fd=self.fd)
        try:
            with Folder(os.open(box, _FOLDER, dir_fd=self.fd), os.path.join(self.path, box)) as inbox:
                fs.get_file(remote, inbox.by_descriptor(DATA))
                problem = check(inbox, DATA) if check else None
                if problem is None or keep_failed:
                    os.rename(DATA, name, src_dir_fd=inbox.fd, dst_dir_fd=self.fd)
                return problem
        finally:
            self.discard(box)

    def by_descriptor(self, name: str) -> str:
        """A path to `name` here for code that takes paths (fsspec): through the folder's descriptor
        where /proc offers it, so no link on the way, even one put there meanwhile, is followed."""
        through = f"/proc/self/fd/{self.fd}"
        return os.path.join(through if os.path.isdir(through) else self.path, name)

    def write_bytes(self, name: str, data: bytes, tmp: str) -> None:
        """Writes `name` whole: into `tmp`, created exclusively, then renamed over it (a link there included)."""
        fd = os.open(tmp, _NEW, 0o644, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self.remove(tmp)
            raise

    def remove(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def discard(self, name: str) -> None:
        """Removes `name`: a folder with everything in it, or a file or link itself."""
        st = self.lstat(name)
        if st is not None and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=self.fd)
        elif st is not None:
            self.remove(name)

    def touch(self, name: str) -> None:
        os.utime(name, dir_fd=self.fd, follow_symlinks=False)

    def names(self) -> list[str]:
        return os.listdir(self.fd)


def _open_child(fd: int, name: str, create: bool, path: str) -> int | None:
    # Threads of one process (the cache's fetches) may open the same folder at once: whoever comes second
    # finds the link gone or the folder made, and opens that; a link planted again is refused at the end.
    for _ in range(2):
        try:
            return os.open(name, _FOLDER, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if not create:
                return None
            _remove_link(fd, name, path)
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
        except FileExistsError:
            pass  # another process made it meanwhile
    return os.open(name, _FOLDER, dir_fd=fd)


def _remove_link(fd: int, name: str, path: str) -> None:
    """Removes the symbolic link `name`, not what it points to; a file in the way is an error."""
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            os.unlink(name, dir_fd=fd)
        elif not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, "a file is in the way of a folder", path)
    except (FileNotFoundError, IsADirectoryError):
        pass  # another thread removed the link, or made the folder, between our look and our unlink
