"""Which TFRecord shards break, and where: every record read once (CRC checked, nothing parsed).

Training runs it with --skip-corrupt (to count what it skipped) or after a read failed, and the gate
after a failed read, so both name the shard in one line instead of TensorFlow's DataLossError.
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
        if error is None and readable < shard.records:
            error = f"ends after {readable} records"
        results.append(ShardScan(shard.uri, shard.records, readable, error))
    return results
