"""The shard cache's folder: the user's own or refused, shared between live processes without one
evicting what another reads, and no partial copy left behind by a writer that is gone."""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import subprocess
import sys

import pytest

from components.common import cache_folder
from components.common.shard_cache import CacheError, ShardCache
from components.common.spans import Spans
from tests.components.common.cache_holder import shards_json
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span
from tests.hints import assert_runnable
from tests.waiting import first_line, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache-folder-source"))
    write_span(root, 1, {"train": tiny_records(24)}, TRAIN_LABELS, {"train": 3})
    return Spans(root).shards("train")


def _holder(folder, max_gb, shards, *extra) -> subprocess.Popen:
    """Another run staging `shards` into `folder`, in its own process; it holds them until its stdin closes."""
    return subprocess.Popen([sys.executable, "-m", "tests.components.common.cache_holder", str(folder), str(max_gb),
                             shards_json(shards), *map(str, extra)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=REPO))


def _staged(holder: subprocess.Popen) -> None:
    line = first_line(holder, "the other run to stage its copies")
    assert line == "staged", line + holder.stderr.read()


def _writer(pipe, process: subprocess.Popen):
    """The pipe's writing end, once `process` has opened it to read (an open that blocks could wait forever)."""
    def attempt():
        try:
            return os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            return None

    fd = wait_for(attempt, "the other run to open its source", process=process)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


def _files(folder) -> set[str]:
    """Every file and folder below `folder`."""
    return {os.path.relpath(os.path.join(d, f), folder) for d, folders, files in os.walk(folder) for f in folders + files}


# ---------------------------------------------------------------- whose folder


def test_the_tests_keep_the_cache_in_their_own_temporary_folder(tmp_path_factory):
    folder = cache_folder.default_folder()
    assert folder.startswith(str(tmp_path_factory.getbasetemp()) + os.sep), folder


def test_the_default_folder_is_the_users_own(monkeypatch, tmp_path):
    monkeypatch.delenv(cache_folder.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_folder.default_folder() == str(tmp_path / "home" / ".cache" / "stoke")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # XDG says: ignore a relative one
    assert cache_folder.default_folder() == str(tmp_path / "home" / ".cache" / "stoke")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder.default_folder() == str(tmp_path / "xdg" / "stoke")
    monkeypatch.setenv(cache_folder.CACHE_DIR_ENV, str(tmp_path / "nvme"))
    assert cache_folder.default_folder() == str(tmp_path / "nvme")


def test_a_new_folder_is_made_private_whatever_the_umask(shards, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # its parent does not exist yet either
    monkeypatch.delenv(cache_folder.CACHE_DIR_ENV, raising=False)
    old = os.umask(0)
    try:
        cache = ShardCache(None, max_gb=1)
        cache.stage(shards[:1])
    finally:
        os.umask(old)
    assert cache.folder == str(tmp_path / "xdg" / "stoke")
    assert stat.S_IMODE(os.stat(cache.folder).st_mode) == 0o700


def _someone_elses(tmp_path) -> str:
    if os.geteuid() == 0:
        folder = tmp_path / "theirs"
        folder.mkdir(mode=0o755)
        os.chown(folder, 65534, 65534)
        return str(folder)
    return "/"  # root's, and not writable by others


@pytest.mark.parametrize("kind", ["link", "file", "another user's", "0770", "0777", "1777", "a pattern"])
def test_a_folder_others_could_write_or_swap_is_refused_in_one_line(shards, tmp_path, kind):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    folder = tmp_path / "cache"
    if kind == "link":
        folder.symlink_to(target)
    elif kind == "file":
        folder.write_text("not a folder")
    elif kind == "another user's":
        folder = _someone_elses(tmp_path)
    elif kind == "a pattern":  # TensorFlow would read its copies' path as one: refused before it is made
        folder = tmp_path / "cache[1]" / "stoke"
    else:
        folder.mkdir()
        folder.chmod(int(kind, 8))
    before = _files(tmp_path)
    with pytest.raises(CacheError) as refused:
        ShardCache(str(folder), max_gb=1).stage(shards)
    assert "\n" not in str(refused.value) and "--shard-cache-dir" in str(refused.value)
    assert_runnable(str(refused.value))
    assert _files(tmp_path) == before and not os.listdir(target)  # nothing written, through the link neither


def test_a_folder_of_ones_own_that_others_may_only_read_is_used(shards, tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    assert ShardCache(str(folder), max_gb=1).stage(shards).fetched == len(shards)


# ---------------------------------------------------------------- two runs, one folder


def test_copies_another_live_process_reads_are_never_evicted(shards, tmp_path):
    a, b, c = shards
    cap = (a.bytes + b.bytes + c.bytes - 1) / 1e9  # two of three fit
    other = _holder(tmp_path, cap, [a, b])
    try:
        _staged(other)
        cache = ShardCache(str(tmp_path), max_gb=cap)
        with pytest.raises(CacheError, match="running processes read"):
            cache.stage([c])  # the only copies to evict are the other run's
        assert os.path.exists(cache.path(a)) and os.path.exists(cache.path(b))
        other.stdin.close()
        assert other.wait(timeout=60) == 0
    finally:
        other.kill()
    assert cache.stage([c]).fetched == 1  # its holder is gone: now one of its copies makes room
    assert sum(os.path.exists(cache.path(s)) for s in (a, b)) == 1
    assert len(os.listdir(tmp_path / ".pins")) == 2  # the lock and this process's pin: the stale one is gone


def test_a_pin_dies_with_a_killed_holder(shards, tmp_path):
    a, b, _ = shards
    one = (max(a.bytes, b.bytes) + 1) / 1e9  # room for one copy
    other = _holder(tmp_path, one, [a])
    try:
        _staged(other)
        cache = ShardCache(str(tmp_path), max_gb=one)
        with pytest.raises(CacheError, match="running processes read"):
            cache.stage([b])
        os.kill(other.pid, signal.SIGKILL)
        other.wait(timeout=60)
    finally:
        other.kill()
    assert cache.stage([b]).fetched == 1 and not os.path.exists(cache.path(a))


def test_a_live_pin_that_cannot_be_read_pins_everything(shards, tmp_path):
    a, b, _ = shards
    one = (max(a.bytes, b.bytes) + 1) / 1e9
    cache = ShardCache(str(tmp_path), max_gb=one)
    cache.stage([a])
    garbled = tmp_path / ".pins" / "someone.json"
    garbled.parent.mkdir(exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(garbled)!r}, os.O_RDWR | os.O_CREAT)\n"
        "os.write(fd, b'{not json')\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first_line(holder, "the holder to lock its pin") == "held"
        with pytest.raises(CacheError, match="running processes read"):
            ShardCache(str(tmp_path), max_gb=one).stage([b])
        assert os.path.exists(cache.path(a))
    finally:
        holder.kill()
        holder.wait(timeout=60)
    fd = os.open(garbled, os.O_RDONLY)  # its holder is gone: nobody holds it now
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- partial copies


def test_a_copy_that_fails_on_a_full_disk_leaves_no_partial(shards, tmp_path):
    limited = _holder(tmp_path, 1, shards[:1], shards[0].bytes // 2)
    out, err = limited.communicate(timeout=120)
    assert limited.returncode == 1, out + err
    line = out.strip()
    assert line.startswith("error: copying ") and "File too large" in line and "\n" not in line
    assert not [f for f in _files(tmp_path) if ".part-" in f]


def test_partials_of_writers_that_are_gone_are_swept_and_a_live_writers_are_left(shards, tmp_path):
    """The other run copies from a pipe, so it stays in the middle of its copy until the test feeds it."""
    a, b, _ = shards
    source = tmp_path / "source" / "data" / "spans" / "span-00001"
    source.mkdir(parents=True)
    pipe = source / os.path.basename(a.uri)
    os.mkfifo(pipe)
    piped = type(a)(f"pipe://{pipe}", a.compression, a.records, a.span, a.bytes, a.sha256)
    cache = ShardCache(str(tmp_path / "cache"), max_gb=1)
    debris = os.path.join(os.path.dirname(cache.path(b)), "old.tfrecord.gz.part-12345")  # no pin of that name lives
    for run in ("finishes", "is killed"):
        other = _holder(cache.folder, 1, [piped])
        try:
            with _writer(pipe, other) as feed:
                partial = wait_for(lambda: [f for f in _files(cache.folder) if ".part-" in f and "12345" not in f],
                                   "the other run's partial copy", process=other)
                os.makedirs(os.path.dirname(debris), exist_ok=True)
                open(debris, "wb").close()
                cache.stage([b])  # sweeps at its start: the debris goes, the live writer's partial stays
                assert not os.path.exists(debris) and os.path.exists(os.path.join(cache.folder, partial[0]))
                if run == "is killed":
                    os.kill(other.pid, signal.SIGKILL)
                    other.wait(timeout=60)
                else:
                    feed.write(open(a.uri, "rb").read())
            if run == "finishes":
                _staged(other)
                assert open(cache.path(piped), "rb").read() == open(a.uri, "rb").read()
                os.remove(cache.path(piped))
        finally:
            other.kill()
            other.wait(timeout=60)
    cache.stage([b])
    assert not [f for f in _files(cache.folder) if ".part-" in f]
