"""The times Stoke writes: one format for every result file, one for run ids."""
from __future__ import annotations

import datetime
import time


def now() -> str:
    """UTC now as result files store it (created, validated_at, pushed_at, ...): `2026-01-01T02:00:00Z`."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_id() -> str:
    """A new run's default id, in local time as the operator reads it: `run-20260101-020000`."""
    return time.strftime("run-%Y%m%d-%H%M%S")
