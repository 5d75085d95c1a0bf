"""The time Stoke writes into every result file (run ids are the layout's: contracts/layout.py)."""
from __future__ import annotations

import datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def now() -> str:
    """UTC now as result files store it (created, gated_at, pushed_at, ...): `2026-01-01T02:00:00Z`."""
    return datetime.datetime.now(datetime.UTC).strftime(FORMAT)


def days_between(earlier: str, later: str) -> int:
    """Whole days from one timestamp as result files store them to another."""
    return (datetime.datetime.strptime(later, FORMAT) - datetime.datetime.strptime(earlier, FORMAT)).days
