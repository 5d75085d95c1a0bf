"""A span's content index (contracts/layout.py: CONTENT_INDEX): one line per record, sorted by
SHA-256, `sha256 TAB dhash TAB split TAB "label" TAB "uri"` (label and URI as JSON strings).
Ingest writes it and streams it against new arrivals; the data check reads a span's dHashes from it.

Read only through `read_index`, which checks the file as it streams: gzip whole (its CRC and length
are checked at its end, so a cut anywhere shows), every line of that shape, SHA-256s strictly
increasing (no line out of place, none twice) and, at the end, as many lines as the span's manifest
counts records. The count is the manifest's, not a header's: the manifest is written last and is
the span's record, while a header inside the file could only repeat it and could be wrong with the
file. A reader that trusted an unsorted or short index would let exact copies through; one that
fails on it stops every later ingest. components/common/trusted_index.py rebuilds a broken one.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import uuid
import zlib
from collections.abc import Iterator

from components.common.files import filesystem, is_local, is_uri
from components.contracts.results import ResultError
from components.contracts.schema import SPLITS
from components.contracts.secrets import recorded

# Possessive: a line that fails must fail in linear time, whatever it holds.
_JSON_STRING = r'"(?:[^"\\\x00-\x1f]++|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+"'
LINE = re.compile(rf"[0-9a-f]{{64}}\t[0-9a-f]{{16}}\t(?:{'|'.join(SPLITS)})\t{_JSON_STRING}\t{_JSON_STRING}")


class BrokenIndex(ResultError):
    """A content index that cannot be trusted: missing, cut short, unsorted, not gzip or not one."""

    def __init__(self, number: int, uri: str, why: str):
        super().__init__(f"{uri}: {why}")
        self.number, self.uri, self.why = number, uri, why


def read_index(uri: str, number: int, expected: int) -> Iterator[str]:
    """The lines of span `number`'s index, without their newline, each checked before it is given;
    raises BrokenIndex at the first sign of damage, and after the last line when there are not
    `expected` of them."""
    count, previous = 0, ""
    try:
        fs, path = filesystem(uri)
        with fs.open(path, "rb") as raw, gzip.open(raw, "rt", encoding="ascii", newline="\n") as f:
            for line in f:
                if not line.endswith("\n"):
                    raise BrokenIndex(number, uri, f"line {count + 1} is cut short")
                line = line[:-1]
                if not LINE.fullmatch(line):
                    raise BrokenIndex(number, uri, f"line {count + 1} is not an index line")
                if line[:64] <= previous:
                    raise BrokenIndex(number, uri, f"line {count + 1} is out of order (or repeats one)")
                previous, count = line[:64], count + 1
                yield line
    except BrokenIndex:
        raise
    except FileNotFoundError:
        raise BrokenIndex(number, uri, "missing") from None
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as error:  # cut short, not gzip, not text
        raise BrokenIndex(number, uri, f"damaged ({error or type(error).__name__})") from None
    if count != expected:
        raise BrokenIndex(number, uri, f"{count} lines where the span's manifest counts {expected} records")


def write_index(uri: str, kept: list[dict]) -> None:
    """A span's content index from the records' signatures, sorted by SHA-256; the same records give
    the same bytes (no time in the gzip header). Locally through a temp name and a rename, on object
    stores in one upload, so a reader sees a whole index or none."""
    fs, path = filesystem(uri)
    target = f"{path}.{uuid.uuid4().hex[:8]}.tmp" if is_local(fs) else path
    try:
        ordered = sorted(kept, key=lambda s: (s["sha256"], s["uri"]))
        with fs.open(target, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
            for start in range(0, len(ordered), 10_000):  # a few writes, not one per line
                f.write("".join(f"{s['sha256']}\t{s['dhash']}\t{s['split']}\t{json.dumps(s['label'])}\t"
                                f"{json.dumps(s['uri'])}\n" for s in ordered[start:start + 10_000]).encode("ascii"))
        if is_local(fs):
            os.replace(target, path)
    except BaseException:
        if is_local(fs) and os.path.exists(target):
            os.remove(target)
        raise


def parse(line: str) -> tuple[str, str, str, str, str]:
    """(sha256, dhash, split, label, uri) of an index line; the URI without credentials and query, as
    ingest names files, whatever a span published before that kept (it reaches dead letters and manifests)."""
    sha, dhash, split, label, uri = line.split("\t", 4)
    uri = json.loads(uri)
    return sha, dhash, split, json.loads(label), recorded(uri) if is_uri(uri) else uri
