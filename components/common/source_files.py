"""What a SOURCE holds, as ingest lists it and preflight checks it: which files are images, and the
columns of a CSV or JSONL manifest, `uri,label[,split]`.

Images are files with an image extension outside hidden files and folders; sidecars (.txt, .json,
...) are not. A CSV's first row is a header when its first cell names no file: no `.`, `/`, `\\` or
`:` in it, which every path and file name with an extension has (`uri`, `path`, `image` are headers;
`cat/a.jpg`, `a.png`, `s3://b/a` are data). A header names exactly the columns, each once, in any
order (case and spaces around a name do not matter), and the rows are read by it. A CSV without a
header is read by position, uri then label then split, as it always was. A JSONL manifest's rows are
objects with these keys; its first object is held to the rule a header is. Anything else is refused
naming the columns, so a header `path,label` is never read as a row, nor `uri,class` as a label by
position.
"""
from __future__ import annotations

import csv
import json
import posixpath

EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"})
COLUMNS = ("uri", "label", "split")
REQUIRED = ("uri", "label")
EXPECTED = ("a manifest's columns are uri,label[,split]: a first row naming them, in any order, or no header "
            "and the columns in that order")


def is_candidate(relative_path: str) -> bool:
    """Images only: hidden files and folders and sidecars (.txt, .json, ...) are not sources."""
    parts = relative_path.split("/")
    if any(part.startswith(".") for part in parts):
        return False
    return posixpath.splitext(parts[-1])[1].lower() in EXTENSIONS


def no_images(source: str) -> str:
    """The one line for a folder SOURCE without a single image, from ingest and preflight alike."""
    return (f"SOURCE holds no images: {source} has no image files (.jpg, .png, .gif, .bmp, .tiff, .webp, ...) in "
            "class folders; hidden files and sidecars (.txt, .json, ...) are not images")


class ManifestError(ValueError):
    """A manifest that cannot be read as one; the message names the columns it should have."""


def is_header(cells: list[str]) -> bool:
    """A first row that names columns, not a file."""
    first = cells[0].strip() if cells else ""
    return not any(mark in first for mark in "./\\:")


def header(manifest: str, cells: list[str]) -> tuple[str, ...]:
    """The columns a CSV header names, in its order; ManifestError unless they are uri,label[,split]."""
    names = tuple(cell.strip().lower() for cell in cells)
    wrong = problem(names)
    if wrong:
        raise ManifestError(f"manifest {manifest}: its header {','.join(cell.strip() for cell in cells)} {wrong}; {EXPECTED}")
    return names


def check_keys(manifest: str, row: dict) -> None:
    """A JSONL manifest's first object: ManifestError unless its keys are uri,label[,split]."""
    wrong = problem(tuple(row))
    if wrong:
        raise ManifestError(f"manifest {manifest}: its first row's keys {','.join(map(str, row))} {wrong}; {EXPECTED}")


def check_first_row(manifest: str, line: str, jsonl: bool) -> bool:
    """Checks a manifest's first line as ingest would read it (preflight reads only the file's start);
    True when it is a header. A line that does not parse is left for ingest to set aside as a row."""
    if jsonl:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            return False
        if isinstance(row, dict):
            check_keys(manifest, row)
        return False
    try:
        cells = next(csv.reader([line]), [])
    except csv.Error:
        return False
    if is_header(cells):
        header(manifest, cells)
        return True
    return False


def problem(names: tuple[str, ...]) -> str | None:
    """What is wrong with these column names ("has no column label, an unknown column class"), or None."""
    unknown = [name for name in names if name not in COLUMNS]
    missing = [name for name in REQUIRED if name not in names]
    repeated = sorted({name for name in names if names.count(name) > 1 and name in COLUMNS})
    found = [f"no column {', '.join(missing)}"] if missing else []
    if unknown:
        found.append(f"the unknown column{'s' * (len(unknown) > 1)} {', '.join(name or repr(name) for name in unknown)}")
    if repeated:
        found.append(f"{', '.join(repeated)} twice")
    return f"has {' and '.join(found)}" if found else None


def no_rows(manifest: str) -> ManifestError:
    return ManifestError(f"SOURCE holds no images: manifest {manifest} has no rows; {EXPECTED}")
