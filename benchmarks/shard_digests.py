"""What checking a local span against its manifest costs a run, side by side with what the run reads anyway.

    python -m benchmarks.shard_digests [--shards 64] [--shard-mb 16]

Writes a span of GZIP TFRecord shards (random bytes in TFRecord frames, about 1 GB by default) and times:
  first_check_s    the first run after the span is published: the size of each shard, and its SHA-256
                   (components/common/shard_digests.py), recorded
  later_check_s    every later run: the size and the recorded identity of each shard (stat), nothing hashed
  unrecorded_s     a run whose cache folder is refused: every shard hashed, every time
  read_once_s      one pass of TensorFlow's reader over the same shards (decompression and CRCs, no
                   decoding): what one epoch reads before any image is decoded
and the check's share of one such pass. The files were just written, so they are in the page cache: this
measures hashing, not the disk (a cold disk bounds the hash and the read alike). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time

from benchmarks.shard_cache import write_shards
from components.common import shard_digests
from components.contracts.layout import Shard


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--shard-mb", type=float, default=16)
    args = parser.parse_args(argv)
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="stoke-bench-digests-") as work:
        span = os.path.join(work, "span-00001")
        os.makedirs(span)
        shards = []
        for path, records, size in write_shards(span, args.shards, args.shard_mb):
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            shards.append(Shard(path, "GZIP", records, 1, size, digest))
        later = time.time() + shard_digests.RACY_SECONDS  # a run some seconds after ingest wrote the span
        first = shard_digests.check(shards, os.path.join(work, "cache"), now=later)
        again = shard_digests.check(shards, os.path.join(work, "cache"), now=later)
        shared = os.path.join(work, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        unrecorded = shard_digests.check(shards, shared, now=later)
        assert not (first.mismatched or again.mismatched or unrecorded.mismatched)
        assert (first.hashed, again.hashed, unrecorded.hashed) == (len(shards), 0, len(shards))
        started = time.perf_counter()
        records = tf.data.TFRecordDataset([s.uri for s in shards], "GZIP", buffer_size=4 << 20, num_parallel_reads=4)
        count = int(records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
        read_once = time.perf_counter() - started
        assert count == sum(s.records for s in shards)
    result = {"shards": len(shards), "gb": round(sum(s.bytes for s in shards) / 1e9, 3),
              "first_check_s": round(first.seconds, 3), "later_check_s": round(again.seconds, 4),
              "unrecorded_s": round(unrecorded.seconds, 3), "read_once_s": round(read_once, 3),
              "first_check_gb_per_s": round(first.bytes_hashed / 1e9 / first.seconds, 2),
              "first_check_vs_read_once": round(first.seconds / read_once, 3),
              "later_check_vs_read_once": round(again.seconds / read_once, 5)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
