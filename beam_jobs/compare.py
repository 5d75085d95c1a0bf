"""What of a listing no published span holds, in memory that does not grow with what is published.

    listing  -> identity lines, sorted on a local disk in chunks       (beam_jobs/spill.py)
    spans    -> each span's sorted source index, merged k-way           (beam_jobs/source_index.py)
    one streaming pass over both, grouped by URI -> new files only

Memory holds a chunk of the listing while it is sorted, one line per open index while merging, and
what is new; never every published identity. The same pass finds the files a span holds under their URI
at the same size but another version (a `touch`, a re-upload): the only ones whose content
beam_jobs/unchanged.py needs to compare.
"""
from __future__ import annotations

import heapq
import json
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby

from beam_jobs.source_index import BrokenIndex, exists_for, identity, read_source_index, rebuild
from beam_jobs.sources import Source
from beam_jobs.spill import SortedLines, read_lines
from components.common.spans import Spans
from components.contracts.layout import Root

FAN_IN = 128  # span indexes open at once: well below any limit on open files


@dataclass
class Comparison:
    fresh: list[Source] = field(default_factory=list)  # files no published span holds
    refused: list[tuple[Source, str]] = field(default_factory=list)  # unusable ones, new too, with why
    touched: list[Source] = field(default_factory=list)  # of `fresh`: a span holds the URI at this size


def compare(listed: Iterable[tuple[Source, str | None]], root: Root) -> Comparison:
    """The listed sources (with a reason when refused) that no published span holds, quarantined
    spans included: their files are published too."""
    with SortedLines(_line(source, reason) for source, reason in listed) as lines, \
            tempfile.TemporaryDirectory(prefix="stoke-index-") as workdir:
        indexes = {number: root.source_index(number) for number in Spans(root).published()}
        for number in [n for n in indexes if not exists_for(root, n)]:
            indexes[number] = rebuild(root, number, workdir)
        rebuilt: set[int] = set()
        while True:
            try:
                return _merge(lines, _published(indexes, workdir))
            except BrokenIndex as broken:
                if broken.number in rebuilt:
                    raise  # rebuilt from the manifest and still unreadable: the store itself fails
                rebuilt.add(broken.number)
                indexes[broken.number] = rebuild(root, broken.number, workdir, broken.why)


def _published(indexes: dict[int, str], workdir: str) -> Iterator[str]:
    """Every span's identities in one sorted stream. Past FAN_IN spans, groups are merged into local
    files first, so no more than FAN_IN indexes are open at once whatever the number of spans."""
    streams = [read_source_index(uri, number) for number, uri in indexes.items()]
    while len(streams) > FAN_IN:
        merged = []
        for start in range(0, len(streams), FAN_IN):
            path = os.path.join(workdir, f"merged-{uuid.uuid4().hex[:8]}")
            with open(path, "w", encoding="ascii", newline="\n") as f:
                f.writelines(line + "\n" for line in heapq.merge(*streams[start:start + FAN_IN]))
            merged.append(read_lines(path))
        streams = merged
    return heapq.merge(*streams)


def _line(source: Source, reason: str | None) -> str:
    """The source's identity line, then all it takes to make the Source again."""
    payload = [source.uri, source.size, source.version, source.label, source.split, source.key, reason, source.fixed,
               source.query]  # spilled to a private temp folder, never under ROOT
    return f"{identity(source.uri, source.size, source.version)}\t{json.dumps(payload)}"


def _uri(line: str) -> str:
    # The URI is a JSON string, which never holds a raw tab: the first tab ends it. No JSON string
    # is a prefix of another, so lines sorted whole are sorted by this field, and one URI's lines
    # are next to each other.
    return line.partition("\t")[0]


def _merge(listed: Iterable[str], published: Iterable[str]) -> Comparison:
    found = Comparison()
    spans = groupby(published, key=_uri)
    uri, entries = next(spans, (None, ()))
    for name, group in groupby(listed, key=_uri):
        while uri is not None and uri < name:
            uri, entries = next(spans, (None, ()))
        held = {entry.partition("\t")[2] for entry in entries} if uri == name else set()
        sizes = {h.partition("\t")[0] for h in held}
        for line in group:
            _, size, version, payload = line.split("\t", 3)
            if f"{size}\t{version}" in held:
                continue
            uri_, size_, version_, label, split, key, reason, fixed, query = json.loads(payload)
            source = Source(uri_, size_, version_, label, split, key, fixed, query)
            if reason is not None:
                found.refused.append((source, reason))
                continue
            found.fresh.append(source)
            if size in sizes:
                found.touched.append(source)
    return found
