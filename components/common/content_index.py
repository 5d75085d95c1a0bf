"""A span's content index (contracts/layout.py: CONTENT_INDEX): one line per record, sorted by
SHA-256, `sha256 TAB dhash TAB split TAB "label" TAB "uri"` (label and URI as JSON strings).
Ingest writes it and streams it against new arrivals; the data check reads a span's dHashes from it."""
from __future__ import annotations

import json
from collections.abc import Iterator

import fsspec


def read_index(uri: str) -> Iterator[str]:
    """The lines of a content index, without their newline."""
    with fsspec.open(uri, "rt", compression="gzip", encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


def write_index(uri: str, kept: list[dict]) -> None:
    """A span's content index from the records' signatures, sorted by SHA-256."""
    with fsspec.open(uri, "wt", compression="gzip", encoding="utf-8") as f:
        for s in sorted(kept, key=lambda s: (s["sha256"], s["uri"])):
            f.write(f"{s['sha256']}\t{s['dhash']}\t{s['split']}\t{json.dumps(s['label'])}\t{json.dumps(s['uri'])}\n")


def parse(line: str) -> tuple[str, str, str, str, str]:
    """(sha256, dhash, split, label, uri) of an index line."""
    sha, dhash, split, label, uri = line.split("\t", 4)
    return sha, dhash, split, json.loads(label), json.loads(uri)
