"""The gate's eval shards when TensorFlow cannot read them: which shard, and why, in one line.

A truncated or bit-flipped shard makes TensorFlow raise DataLossError wherever it is read (the
label scan, TFMA inside Beam, the paired comparison), and Beam wraps what its workers raise. Each
read runs under `named_corruption`, which turns any such failure into a GateError naming the
shards that break, found by reading every record once (CRC checked, nothing parsed).
"""
from __future__ import annotations

import contextlib

from components.common.shard_scan import scan_shards

# What TensorFlow's record reader, or Beam's own (a ValueError), says about a damaged file, in
# whatever exception Beam re-raises.
_SIGNS = ("DataLossError", "corrupted record", "truncated record", "Data loss", "Not a valid TFRecord",
          "Compressed file ended", "Error -3 while decompressing")


def damaged(error: BaseException) -> bool:
    """Whether `error`, an exception it wraps or its message, is TensorFlow's DataLossError."""
    import tensorflow as tf

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, tf.errors.DataLossError) or any(sign in str(error) for sign in _SIGNS):
            return True
        error = error.__cause__ or error.__context__
    return False


def broken(shards) -> list[str]:
    """'<uri> (<why>; N of M records readable)' for each shard that does not read to its end."""
    return [f"{scan.uri} ({scan.error}; {scan.readable} of {scan.expected} records readable)"
            for scan in scan_shards(shards) if scan.error]


@contextlib.contextmanager
def named_corruption(shards, refuse):
    """Runs the block; a damaged-record failure becomes `refuse(message)` naming the bad shards."""
    try:
        yield
    except Exception as error:
        if not damaged(error):
            raise
        bad = broken(shards)
        if not bad:
            raise
        raise refuse(f"corrupt eval shard: {', '.join(bad)}; restore or re-ingest the span, "
                     "then gate again") from None
