"""The shard cache's folder: where it is, whose it is, and which copies in it running processes read.

The folder is the user's own: $STOKE_CACHE_DIR, else $XDG_CACHE_HOME/stoke, else ~/.cache/stoke, made
with mode 0700. One that is a symbolic link, another user's, or writable by group or others is refused
(CacheError, one line): whoever else can write there could swap a copy or plant a link between a check
and a read, and no check of ours would see it.

Two processes may share the folder. Each holds a pin, CACHE/.pins/<pin>.json, locked with flock for the
process's life and listing the copies it reads (those its latest staging returned, which training and
the gate read to their end): eviction leaves every copy a live pin lists, and a pin
whose lock is free (its holder exited or was killed) is stale and removed. A copy is written as
`<name>.part-<pin>`, so a partial whose pin is gone is debris anyone may sweep, and one whose pin lives
is left to its writer. Pins change, and copies are evicted, under CACHE/.pins/.lock, so an eviction
never reads a pin half-written nor misses a copy pinned before it was checked.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat

from components.common.local_copies import Folder
from components.common.program import setting_hint
from components.contracts.config import NO_PATTERN, pattern_problem

CACHE_DIR_ENV = "STOKE_CACHE_DIR"
PINS = ".pins"
RUNS = "runs"  # training's local run folders (components/train/trainer.py), beside the copies
PART = re.compile(r"\.part-([0-9A-Za-z-]+)$")  # a partial copy, by its writer's pin


class CacheError(Exception):
    """A cache that cannot hold what the run needs, or may not be trusted; the message says what to change."""


def default_folder() -> str:
    """$STOKE_CACHE_DIR (a fast local disk, such as NVMe), else the user's cache folder (XDG's)."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.environ[CACHE_DIR_ENV]
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return os.path.join(xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache"), "stoke")


def refusal(folder: str) -> tuple[str, str] | None:
    """Why `folder` may not hold the cache, and the fix; None when it may, or does not exist yet (it is
    then made, 0700) and TensorFlow would read its path as it is."""
    where = f"{setting_hint(None, {'shard_cache.dir': 'PATH'})} or ${CACHE_DIR_ENV}"
    patterned = pattern_problem(folder, "the shard cache")
    if patterned:
        return patterned, f"name {NO_PATTERN}, {where}"
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None
    fix = f"use a folder of your own for the shard cache, {where}"
    if stat.S_ISLNK(st.st_mode):
        return f"the shard cache {folder} is a symbolic link (to {os.readlink(folder)}), not a folder", fix
    if not stat.S_ISDIR(st.st_mode):
        return f"the shard cache {folder} is not a folder", fix
    if st.st_uid != os.geteuid():
        return f"the shard cache {folder} belongs to user {st.st_uid}, not to you ({os.geteuid()})", fix
    if st.st_mode & 0o022:
        return (f"the shard cache {folder} is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o})", f"`chmod go-w {folder}`, or {fix}")
    return None


def secure(folder: str) -> str:
    """Makes `folder` (mode 0700) or checks it; CacheError when it is refused (a path refused as it is
    named is not made)."""
    refused = refusal(folder)
    if refused is None:
        try:
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as error:
            raise CacheError(f"cannot create the shard cache {folder}: {error.strerror}") from None
        refused = refusal(folder)
    if refused:
        raise CacheError(": ".join(refused))
    return folder


@contextlib.contextmanager
def locked(folder: str):
    """CACHE/.pins, with the cache's lock held: pins change and copies are evicted only inside."""
    with Folder.open(folder, [PINS], create=True) as pins:
        try:
            fd = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pins.fd)
        except OSError as error:  # a link put in its place, say
            raise CacheError(f"cannot open the shard cache's lock {pins.path}/.lock: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield pins
        finally:
            os.close(fd)


class Pin:
    """This process's pin in one cache folder; the lock on it lasts as long as the process."""

    def __init__(self, pins: Folder):
        self.id = f"{os.getpid():x}-{os.urandom(4).hex()}"
        self.pid = os.getpid()
        self.fd = os.open(f"{self.id}.json", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o600, dir_fd=pins.fd)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def list(self, copies) -> None:
        """Lists `copies` (paths relative to the cache folder), and only those; call with the cache's lock held."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(sorted(set(copies))).encode(), 0)


_pins: dict[str, Pin] = {}


def pin(folder: str, copies) -> Pin:
    """Pins `copies` for this process in place of what it pinned before (its pin is made on first use);
    call with the cache's lock held."""
    held = _pins.get(folder)
    # A forked child holds its parent's lock, not a pin of its own; a pin removed with its folder pins nothing.
    if held is None or held.pid != os.getpid() or os.fstat(held.fd).st_nlink == 0:
        if held is not None:
            os.close(held.fd)  # a parent's lock lives on in the parent's own descriptor
        with Folder.open(folder, [PINS], create=True) as pins:
            held = _pins[folder] = Pin(pins)
    held.list(copies)
    return held


def live_pins(pins: Folder) -> dict[str, set[str] | None]:
    """Pin id -> the copies it lists (None: unreadable, so it may hold any) for every live pin; stale pins
    are removed. Call with the cache's lock held."""
    live = {}
    for name in pins.names():
        if not name.endswith(".json"):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pins.fd)
        except FileNotFoundError:
            continue
        except OSError:  # a link or anything else that is no pin of ours
            pins.remove(name)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                live[name[:-len(".json")]] = _listed(fd)
            else:
                pins.remove(name)  # its holder is gone: the lock went with it
        finally:
            os.close(fd)
    return live


def _listed(fd: int) -> set[str] | None:
    try:
        copies = json.loads(os.pread(fd, 1 << 26, 0))
    except ValueError:
        return None
    return set(copies) if isinstance(copies, list) and all(isinstance(c, str) for c in copies) else None


def sweep_partials(folder: str, live: set[str]) -> list[str]:
    """Removes the partial copies (the private folders copies are fetched into, and any file of that
    name) whose writer's pin is not in `live`; returns them, relative to `folder`."""
    swept = []
    for parent, folders, files in os.walk(folder):
        gone = [name for name in folders + files if (m := PART.search(name)) and m.group(1) not in live]
        folders[:] = [f for f in folders if f not in gone and not (parent == folder and f in (PINS, RUNS))]
        for name in gone:
            path = os.path.join(parent, name)
            with contextlib.suppress(FileNotFoundError):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)  # a link is removed itself, never followed
                swept.append(os.path.relpath(path, folder))
    return swept
