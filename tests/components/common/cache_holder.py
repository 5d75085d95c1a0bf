"""Another run on the same shard cache, in its own process: `python -m tests.components.common.cache_holder
FOLDER MAX_GB SHARDS_JSON [FILE_LIMIT]` stages the shards, prints "staged" (or the cache's one error
line), and holds on to them until its stdin closes. With FILE_LIMIT, no file it writes may grow past
that many bytes, as on a disk that fills up mid-copy. A shard at pipe://PATH is read from the named pipe
PATH: a store that answers as slowly as the test wants, so the run stays in the middle of its copy."""
from __future__ import annotations

import dataclasses
import json
import resource
import signal
import sys

import fsspec
from fsspec.spec import AbstractFileSystem

from components.common.shard_cache import CacheError, ShardCache
from components.contracts.layout import Shard


class PipeFileSystem(AbstractFileSystem):
    protocol = "pipe"

    def info(self, path, **kwargs):
        return {"name": path, "type": "file", "size": None}

    def _open(self, path, mode="rb", **kwargs):
        return open(path, mode)


def shards_json(shards: list[Shard]) -> str:
    return json.dumps([dataclasses.asdict(s) for s in shards])


def main(folder: str, max_gb: str, shards: str, file_limit: str | None = None) -> int:
    if file_limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(file_limit), int(file_limit)))
    fsspec.register_implementation("pipe", PipeFileSystem)
    cache = ShardCache(folder, float(max_gb))
    try:
        cache.stage([Shard(**s) for s in json.loads(shards)])
    except CacheError as error:
        print(f"error: {error}", flush=True)
        return 1
    print("staged", flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
