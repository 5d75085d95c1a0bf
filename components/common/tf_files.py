"""Where TensorFlow reads and writes for itself, and local copies where it cannot.

TensorFlow's own file systems (tf.data, checkpoints, SavedModels, TensorBoard) know local disks and
gs://; s3:// went to the tensorflow-io package, which no longer follows TensorFlow's releases. So a
ROOT on any other fsspec store takes one path: what TensorFlow reads is copied to a local disk first
(shards through components/common/shard_cache.py, models and folders here), and what it writes goes
to a local folder that is uploaded afterwards, the file that marks it complete last. Copies down go
through components/common/local_copies.py, which keeps each inside its local folder.
"""
from __future__ import annotations

import os
import posixpath
import tempfile

from components.common.cache_folder import default_folder, refusal
from components.common.files import filesystem, is_local, protocol
from components.common.local_copies import copy_file, copy_tree
from components.contracts.config import NO_PATTERN, pattern_problem

# gcsfs reads this to talk to an emulator; TensorFlow's GCS client always talks to Google.
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def tf_reads(uri: str) -> bool:
    """Whether TensorFlow opens `uri` itself: local paths, and gs:// (its built-in GCS client reads
    shards as fast as a copy would, without the copy) unless an emulator stands in for GCS."""
    fs, _ = filesystem(uri)
    if is_local(fs):
        return True
    return protocol(fs) in ("gs", "gcs") and not os.environ.get(GCS_EMULATOR_ENV)


def access(uri: str) -> str:
    """How a run reaches `uri`, for its report: "direct" or "local copies"."""
    return "direct" if tf_reads(uri) else "local copies"


def folders_problem(cache_dir: str | None) -> str | None:
    """Why TensorFlow could not load what a run keeps in the local folders it reads below, and the fix; None
    when it could. They are the shard cache (a bucket ROOT's shards, and training's folder before its upload)
    and the temporary folder (a bucket ROOT's models are copied there to be loaded, and the gate's serving
    check serves its candidate from there)."""
    cache = os.path.abspath(cache_dir or default_folder())
    if pattern_problem(cache, "the shard cache"):
        return ": ".join(refusal(cache))
    problem = pattern_problem(tempfile.gettempdir(), "the temporary folder")
    return f"{problem}; set $TMPDIR to {NO_PATTERN}" if problem else None


def local_copy(uri: str, scratch: str, name: str) -> str:
    """A path TensorFlow can open for the file or folder `uri`: itself when TensorFlow reads it,
    else a copy in `scratch/name`."""
    fs, path = filesystem(uri)
    if is_local(fs):
        return path
    if tf_reads(uri):
        return uri
    if fs.isdir(path):
        copy_tree(fs, path, os.path.join(scratch, name))
        return os.path.join(scratch, name)
    return copy_file(fs, path, scratch, name)


def pull(uri: str, local: str) -> bool:
    """Copies the folder `uri` into `local` (made empty first); False when there is none. A key that
    would land outside `local` raises UnsafeKey before anything is written."""
    fs, path = filesystem(uri)
    if not fs.isdir(path):
        return False
    copy_tree(fs, path, local)
    return True


def push(local: str, uri: str, last: str | None = None, prune: bool = False) -> None:
    """Uploads the folder `local` to `uri`, files named `last` after every other, so
    a reader that waits for it never sees half the folder. With `prune`, files under `uri` that
    `local` no longer holds are removed, once the new ones are all there."""
    fs, path = filesystem(uri)
    names = sorted((os.path.relpath(os.path.join(folder, f), local)
                    for folder, _, files in os.walk(local) for f in files),
                   key=lambda rel: os.path.basename(rel) == last)
    for rel in names:
        target = posixpath.join(path, rel.replace(os.sep, "/"))
        fs.makedirs(posixpath.dirname(target), exist_ok=True)
        fs.put_file(os.path.join(local, rel), target)
    if prune and fs.isdir(path):
        keep = {posixpath.join(path, rel.replace(os.sep, "/")) for rel in names}
        stale = [p for p in fs.find(path) if p not in keep]
        if stale:
            fs.rm(stale)
