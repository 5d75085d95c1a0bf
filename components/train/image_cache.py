"""train.image_cache on disk: tf.data's file cache, bound to what it holds.

tf.data's `cache(filename)` reads whatever a finished cache of that name holds, whatever it was filled
from. So the name Stoke gives it carries a key of everything that decides what is cached: the digests
of the shards read (their manifests' SHA-256, which training checked the files against) in order, the
split and its preprocessing (training caches whole images decoded at the JPEG scale its image size
allows, evaluation images resized to it), the image size, the records left out
(train.drop_suspected_label_errors), --skip-corrupt, the input pipeline among how many, this module's
VERSION and TensorFlow's. Another ROOT, another span, other labels, another size is another key, and
never reads another's cache. Crops, flips and the network's own rescaling come after the cache, so
they are in neither. The cache is PREFIX-<split>-<key>.index and .data-*; while tf.data writes it,
<name>_N.lockfile and <name>_N.data-*.tempstate*.

A run holds <name>.lock (flock) for as long as it lives. Holding it, it removes what a killed run left
half-written (tf.data's lockfile refuses every later run until someone deletes it), and every other cache
of the split under the same prefix whose lock is free: what stays on disk is one cache per prefix and
split, plus those other runs use at that moment. A run that finds the lock taken (another run on the same data right now)
trains without the file cache and says so, rather than meet tf.data's lockfile. The prefix is a local
path: the lock needs a local file system.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import sys

VERSION = 1  # raise when what the pipeline caches changes
LOCK = ".lock"
# What tf.data writes for a cache `name`: name.index and name.data-*, and while it writes, name_N.lockfile and
# name_N.* files with a .tempstate* ending. Nothing else under the prefix is touched.
TF_FILES = r"(?:_\d+)?(?:\.index|\.data-\d+-of-\d+)(?:\.tempstate\d+)?|_\d+\.lockfile"
_held: dict[str, int] = {}  # cache name -> this process's lock on it, kept for the process's life


def refusal(image_cache: str | None) -> str | None:
    """Why train.image_cache cannot be a file cache here; None when it can (or is unset, or memory)."""
    if image_cache and image_cache != "memory" and "://" in image_cache:
        return (f"train.image_cache {image_cache!r} is not a local path: the file cache is bound to its data by a "
                "lock on a local disk; give a local path prefix, or memory")
    return None


def key(shards, options, context=None) -> str:
    """What a cache of `shards` read with `options` (input_pipeline.PipelineOptions) by the input pipeline of
    `context` (tf.distribute.InputContext; None: the only one) holds, as 16 hex digits."""
    import tensorflow as tf

    if any(not s.sha256 for s in shards):
        raise ValueError("a shard without a SHA-256 in its manifest cannot be cached on disk")
    fields = {"version": VERSION, "tensorflow": tf.__version__, "shards": [s.sha256 for s in shards],
              "training": options.training, "image_size": options.image_size, "exclude": sorted(options.exclude),
              "skip_corrupt": options.skip_corrupt, "pipelines": context.num_input_pipelines if context else 1,
              "pipeline": context.input_pipeline_id if context else 0}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def claim(prefix: str, split: str, cache_key: str) -> str | None:
    """The name to give tf.data's cache of `split` under `prefix`, locked for this process, with what a killed
    run left of it and the split's other caches under the prefix that no run uses removed; None when another
    run holds it."""
    name = f"{os.path.abspath(prefix)}-{split}-{cache_key}"
    if name in _held:
        return name
    os.makedirs(os.path.dirname(name), exist_ok=True)
    lock = _lock(name + LOCK)
    if lock is None:
        print(f"stoke train: another run is using the image cache {name}: this run reads the shards without it",
              file=sys.stderr, flush=True)
        return None
    _held[name] = lock
    caches = _caches(prefix, split)
    if not complete(name):
        _remove(caches.get(name, []), keep=name + LOCK)  # a killed run's lockfile and half-written data, or nothing
    for other, files in caches.items():
        if other != name:
            _discard(other, files)
    return name


def complete(name: str) -> bool:
    """Whether tf.data finished the cache `name` (its index is there, and no writer's lockfile)."""
    folder, base = os.path.split(name)
    return os.path.exists(name + ".index") and not any(
        n.startswith(base + "_") and n.endswith(".lockfile") for n in os.listdir(folder))


def _caches(prefix: str, split: str) -> dict[str, list[str]]:
    """Every cache of `split` under `prefix`, by name, with its files: Stoke's keyed ones and the unkeyed ones
    of before (PREFIX-<split>[-<pipeline>])."""
    folder, base = os.path.split(os.path.abspath(prefix))
    shape = re.compile(rf"^({re.escape(base)}-{split}(?:-[0-9a-f]{{16}}|-\d+)?)(?:{re.escape(LOCK)}|{TF_FILES})$")
    found: dict[str, list[str]] = {}
    for entry in os.listdir(folder):
        match = shape.match(entry)
        if match:
            found.setdefault(os.path.join(folder, match.group(1)), []).append(os.path.join(folder, entry))
    return found


def _discard(name: str, files: list[str]) -> None:
    """Removes the cache `name` when no run holds it (its lock file last, still locked)."""
    lock = _lock(name + LOCK)
    if lock is None:
        return
    try:
        _remove(files, keep=name + LOCK)
        _remove([name + LOCK])
    finally:
        os.close(lock)


def _lock(path: str) -> int | None:
    """An exclusive flock on `path` (created if missing), or None when another holds it. A lock file removed
    and made again between our open and our lock is opened again, so two runs never hold one name."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _remove(paths: list[str], keep: str | None = None) -> None:
    for path in paths:
        if path != keep:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
