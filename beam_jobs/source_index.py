"""A span's source index (contracts/layout.py: SOURCE_INDEX): the identities of the files the span
holds, sorted, so that telling new files from published ones streams instead of holding every
published identity in memory.

Ingest writes the index beside the shards, before the manifest. The manifest stays the record: the
index is derived from its `sources`, so a span published without one (before indexes existed), or
whose index is missing, cut short or damaged, gets it rebuilt from the manifest and stored in the
span folder. Rebuilding rather than failing: the manifest holds the truth, and a reader that trusted
a short index would take the files it lost for new ones and publish them twice. A ROOT this run
cannot write keeps the rebuilt index in a local temp folder for the run.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import uuid
import zlib
from collections.abc import Iterable, Iterator

from beam_jobs.local import canonical
from beam_jobs.spill import SortedLines
from components.common.files import filesystem, is_local, is_uri, read_result
from components.common.program import printable
from components.contracts.layout import Root
from components.contracts.results import ResultError, SpanManifest
from components.contracts.secrets import has_secrets, recorded

HEADER = "# sources "


class BrokenIndex(ResultError):
    """A source index that cannot be trusted: missing, cut short, unsorted or not gzip."""

    def __init__(self, number: int, uri: str, why: str):
        super().__init__(f"{uri}: {why}")
        self.number, self.why = number, why


def identity(uri: str, size: int, version: str) -> str:
    """A source's identity as an index line: local paths by their real path, so spans published
    under another spelling of SOURCE still match; a URI without credentials and query, as ingest names a
    file (beam_jobs/source_names.py), so spans published with SOURCE's password or a row's signature in
    their names match too; JSON keeps tabs and newlines out of the line."""
    name = canonical(uri)
    return f"{json.dumps(recorded(name) if is_uri(name) else name)}\t{int(size)}\t{json.dumps(version)}"


def write_source_index(uri: str, identities: Iterable[str]) -> None:
    """The index of `identities` (lines from `identity`); locally through a temp name and a rename,
    on object stores in one upload, so a reader sees a whole index or none."""
    fs, path = filesystem(uri)
    target = f"{path}.{uuid.uuid4().hex[:8]}.tmp" if is_local(fs) else path
    with SortedLines(identities) as lines:
        if is_local(fs):
            fs.makedirs(os.path.dirname(path), exist_ok=True)
        with fs.open(target, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
            f.write(f"{HEADER}{lines.count}\n".encode())
            for line in lines:
                f.write(line.encode() + b"\n")
    if is_local(fs):
        os.replace(target, path)


def read_source_index(uri: str, number: int) -> Iterator[str]:
    """The index's lines in order; raises BrokenIndex for a missing, damaged or short one (the
    header's count is checked at the end, so a cut at a line's end is caught too)."""
    expected, count, previous = None, 0, ""
    try:
        with filesystem(uri)[0].open(filesystem(uri)[1], "rb") as raw, gzip.open(raw, "rt", encoding="ascii") as f:
            header = f.readline()
            if not (header.startswith(HEADER) and header.endswith("\n") and header[len(HEADER):-1].isdigit()):
                raise BrokenIndex(number, uri, "no `# sources N` header")
            expected = int(header[len(HEADER):-1])
            for line in f:
                line = line.rstrip("\n")
                if line < previous or line.count("\t") != 2:
                    raise BrokenIndex(number, uri, f"line {count + 2} is out of order or not an identity")
                if _with_credentials(line):  # written before names were kept without them: rebuilt without
                    raise BrokenIndex(number, uri, f"line {count + 2} names a file with SOURCE's credentials")
                previous, count = line, count + 1
                yield line
    except BrokenIndex:
        raise
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as error:  # gone, cut short, not gzip
        raise BrokenIndex(number, uri, str(error) or type(error).__name__) from None
    if count != expected:
        raise BrokenIndex(number, uri, f"{count} identities where the header says {expected}")


def _with_credentials(line: str) -> bool:
    name = json.loads(line.partition("\t")[0])
    return is_uri(name) and has_secrets(name)


def rebuild(root: Root, number: int, workdir: str, why: str = "missing") -> str:
    """The span's index built from its manifest and stored in the span; where this run cannot
    write ROOT, in `workdir`. Returns where it is, after a warning line naming the index."""
    manifest = read_result(root.manifest(number), SpanManifest)
    lines = [identity(s.uri, s.size, s.version) for s in manifest.sources]
    del manifest
    uri = where = root.source_index(number)
    try:
        write_source_index(uri, lines)
    except OSError:  # a watcher may read ROOT without the right to write it
        where = os.path.join(workdir, f"{number}.tsv.gz")
        write_source_index(where, lines)
    kept_at = "" if where == uri else f"; kept for this run in {where}, since the span cannot be written"
    print(printable(f"stoke: warning: {uri}: {why}; rebuilt from span {number}'s manifest{kept_at}"), file=sys.stderr,
          flush=True)
    return where


def exists_for(root: Root, number: int) -> bool:
    fs, path = filesystem(root.source_index(number))
    return fs.exists(path)
