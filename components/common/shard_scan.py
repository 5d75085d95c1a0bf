"""Which TFRecord shards break, and where: every record read once (CRC checked, nothing parsed).

Training runs it with --skip-corrupt (to count what it skipped) or after a read failed, and the gate
after a failed read, so both name the shard in one line instead of TensorFlow's DataLossError.

A shard can also read short without an error: TensorFlow's GZIP reader takes the end of some members for
the end of the file (beam_jobs/shards.py says which), and stops there. Ingest writes no such shard since
it knows, but a span published before may hold one; its bytes are those ingest wrote, so only ingesting
its sources again mends it. Training and the gate count the records TensorFlow reads of each shard where
they read them anyway, and stop at one that holds fewer than its manifest counts (`cut_short`).
"""
from __future__ import annotations

import dataclasses

from components.contracts.layout import Shard


@dataclasses.dataclass(frozen=True)
class ShardScan:
    uri: str
    expected: int
    readable: int
    error: str | None
    cut_short: bool = False  # TensorFlow read to an end before the manifest's count, and said nothing

    @property
    def lost(self) -> int:
        return max(self.expected - self.readable, 0)


def scan_shards(shards: list[Shard]) -> list[ShardScan]:
    """Reads every record of every shard (CRC checked, nothing parsed) and reports which break.

    Costs one pass of decompression over the split, which is why training only runs it with
    --skip-corrupt (to count what it skipped) or after a read failed (to name the shard)."""
    import tensorflow as tf

    results = []
    for shard in shards:
        records = tf.data.TFRecordDataset(shard.uri, compression_type=shard.compression, buffer_size=4 << 20)
        readable = int(records.ignore_errors().reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
        error = None
        try:
            for _ in records.skip(readable).take(1):
                pass
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as exc:
            error = exc.message.split("[Op:")[0].split("}}")[-1].strip() or type(exc).__name__
        results.append(ShardScan(shard.uri, shard.records, readable, error) if error else counted(shard, readable))
    return results


def counted(shard: Shard, readable: int) -> ShardScan:
    """The scan of a shard TensorFlow read `readable` records of, without an error."""
    short = readable < shard.records
    return ShardScan(shard.uri, shard.records, readable, f"ends after {readable} records" if short else None, short)


def cut_short(scans: list[ShardScan]) -> str:
    """One line for shards TensorFlow reads short without an error, and what to do."""
    named = "; ".join(f"{s.uri} ({s.readable} of {s.expected} records)" for s in scans[:3]) + (
        f"; and {len(scans) - 3} more" if len(scans) > 3 else "")
    return (f"TensorFlow reads shards short, without an error: {named}: a GZIP member ends where TensorFlow's reader "
            "takes the file for ended (ingest no longer writes such shards); ingest their sources again into a new "
            "span: move the span's folder out of ROOT, then ingest")
