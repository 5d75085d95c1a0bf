"""What a killed ingest leaves under ROOT/data/spans, and the one rule for removing it: a folder
that holds a _MANIFEST.json is a published span, whatever its name or the number inside, and is
never removed. A span folder whose manifest names another number (copied in, or restored from a
backup under another name) stops ingest with what to do, since readers would count it twice."""
from __future__ import annotations

from components.common.files import filesystem, join, read_result
from components.common.spans import Spans
from components.contracts.layout import MANIFEST, Root, span_name
from components.contracts.results import SpanManifest

STAGING_PREFIX = "_staging-"
# What the job leaves in its staging folder for the driver, which reads them and publishes the span.
# Staging is the job's own business, so these names live here and not in the ROOT layout.
STAGED_SHARDS = "shards.json"
STAGED_DEAD_LETTERS = "dead.json"
STAGED_SIGNATURES = "signatures.json"  # the committed bundles' signature files (JSON lines)


class MisplacedSpan(Exception):
    """A published span under a name that is not its own; the message says what to do."""


def remove_debris(root: Root) -> list[str]:
    """Removes staging folders and span folders without a manifest; returns what it removed."""
    fs, spans = filesystem(root.spans)
    if not fs.isdir(spans):
        return []
    debris = []
    for number in Spans(root).span_numbers():
        if not _published(root.span(number)):
            debris.append(root.span(number))
            continue
        written = read_result(root.manifest(number), SpanManifest).span
        if written != number:
            raise MisplacedSpan(
                f"{root.span(number)} holds the manifest of span {written}: move it back to {span_name(written)} "
                "or remove it by hand; nothing was changed")
    for name in names(fs, spans):
        if name.startswith(STAGING_PREFIX):
            folder = join(root.spans, name)
            if _published(folder):
                raise MisplacedSpan(f"{folder} holds a {MANIFEST}: a published span is never removed as "
                                    "debris; move it to its span folder or remove it by hand; nothing was changed")
            debris.append(folder)
    for uri in debris:
        remove(uri)
    return debris


def _published(folder: str) -> bool:
    fs, path = filesystem(join(folder, MANIFEST))
    return fs.exists(path)


def names(fs, path: str) -> list[str]:
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]


def remove(uri: str) -> None:
    fs, path = filesystem(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)
