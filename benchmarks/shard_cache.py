"""Staging shards from an S3-compatible server into the local shard cache, side by side with
reading the same shards from a local disk: the cold copy (download, the size and SHA-256 its
manifest records), the warm check a later run makes (size and SHA-256 of each cached file), and a plain
sequential read of the files.

    python benchmarks/shard_cache.py [--shards 16] [--shard-mb 16]

The server is moto on 127.0.0.1, so the copy measures Stoke's side (parallel requests, the
verification) more than a network; on AWS the bucket's bandwidth bounds it. The shards hold
random bytes in TFRecord frames, GZIP-compressed like ingest's. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import time

from components.common.shard_cache import ShardCache
from components.common.tfrecord import frame
from components.contracts.layout import Shard


def write_shards(folder: str, count: int, mb: float) -> list[tuple[str, int, int]]:
    """`count` GZIP shards of about `mb` MB each: (path, records, bytes)."""
    made = []
    for index in range(count):
        path = os.path.join(folder, f"train-{index:05d}-of-{count:05d}.tfrecord.gz")
        records = max(int(mb * 1e6 / 100_000), 1)
        with gzip.open(path, "wb", compresslevel=1) as f:
            for _ in range(records):
                f.write(frame(os.urandom(100_000)))
        made.append((path, records, os.path.getsize(path)))
    return made


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mb", type=float, default=16)
    args = parser.parse_args(argv)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server._server.server_port}",
                       "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    import fsspec

    work = tempfile.mkdtemp(prefix="stoke-bench-cache-")
    try:
        made = write_shards(work, args.shards, args.shard_mb)
        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        shards = []
        for path, records, size in made:
            key = f"bench/root/data/spans/span-00001/{os.path.basename(path)}"
            fs.put_file(path, key)
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            shards.append(Shard(f"s3://{key}", "GZIP", records, 1, size, digest))
        total = sum(size for _, _, size in made) / 1e6
        cache = ShardCache(os.path.join(work, "cache"), max_gb=100)
        cold = cache.stage(shards)
        started = time.perf_counter()
        warm = cache.stage(shards)
        warm_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for path, _, _ in made:
            with open(path, "rb") as f:
                while f.read(4 << 20):
                    pass
        read_seconds = time.perf_counter() - started
        result = {"shards": args.shards, "mb": round(total, 1),
                  "cold_copy_mb_per_sec": round(total / cold.seconds, 1),
                  "warm_check_mb_per_sec": round(total / warm_seconds, 1), "warm_reused": warm.reused,
                  "local_read_mb_per_sec": round(total / read_seconds, 1),
                  "cold_vs_local_read": round(read_seconds / cold.seconds, 3),
                  "warm_vs_local_read": round(read_seconds / warm_seconds, 3)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
