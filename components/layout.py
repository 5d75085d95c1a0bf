"""The ROOT layout of DESIGN.md: the one place that knows where each artifact lives.

ROOT is a local path or any fsspec URI (s3://, gs://). Every stage reads and writes under it, so
stages hand each other URIs, never objects in memory.
"""
from __future__ import annotations

import json
import posixpath
import re

import fsspec

MANIFEST = "_MANIFEST.json"
DEAD_LETTER = "dead_letter.jsonl"
SPAN_PATTERN = re.compile(r"^span-(\d{5,})$")

# Shard file suffix for each codec the ingest job can write; readers take the codec from the manifest.
SHARD_SUFFIX = {"gzip": ".tfrecord.gz", "zlib": ".tfrecord.zz", "none": ".tfrecord"}
TF_COMPRESSION = {"gzip": "GZIP", "zlib": "ZLIB", "none": ""}


def join(base: str, *parts: str) -> str:
    """Joins path parts onto a local path or a URI without touching its scheme."""
    return posixpath.join(base.rstrip("/") if base != "/" else base, *parts)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem behind a URI and the path within it."""
    return fsspec.core.url_to_fs(uri)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.exists(path)


def read_json(uri: str):
    with fsspec.open(uri, "r", encoding="utf-8") as f:
        return json.load(f)


def write_json(uri: str, value) -> None:
    """Writes JSON in one request on object stores; locally through a temp file and a rename."""
    fs, path = filesystem(uri)
    data = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"
    if is_local(fs):
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        fs.pipe_file(tmp, data)
        fs.mv(tmp, path)
    else:
        fs.pipe_file(path, data)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """A local disk, where renames are atomic; object stores have none."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


class Root:
    """Paths under one artifact ROOT."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/") or "/"

    @property
    def data(self) -> str:
        return join(self.uri, "data")

    @property
    def labels(self) -> str:
        return join(self.data, "labels.json")

    @property
    def spans(self) -> str:
        return join(self.data, "spans")

    def span(self, number: int) -> str:
        return join(self.spans, span_name(number))

    def run(self, run_id: str) -> str:
        return join(self.uri, "runs", run_id)

    def models(self, name: str) -> str:
        return join(self.uri, "models", name)

    @property
    def serving(self) -> str:
        return join(self.uri, "serving")

    def read_labels(self) -> list[str]:
        fs, path = filesystem(self.labels)
        return read_json(self.labels) if fs.exists(path) else []

    def span_numbers(self) -> list[int]:
        """Numbers of every span folder, published or not."""
        fs, path = filesystem(self.spans)
        if not fs.isdir(path):
            return []
        names = (posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
        return sorted(int(m.group(1)) for m in map(SPAN_PATTERN.match, names) if m)

    def manifests(self, spans: list[int] | None = None) -> list[dict]:
        """Manifests of the published spans (those whose _MANIFEST.json exists), oldest first."""
        fs, _ = filesystem(self.spans)
        found = []
        for number in self.span_numbers():
            if spans is not None and number not in spans:
                continue
            uri = join(self.span(number), MANIFEST)
            if fs.exists(filesystem(uri)[1]):
                found.append(read_json(uri))
        return found


def span_name(number: int) -> str:
    return f"span-{number:05d}"


def shard_name(split: str, index: int, count: int, compression: str = "gzip") -> str:
    return f"{split}-{index:05d}-of-{count:05d}{SHARD_SUFFIX[compression]}"

