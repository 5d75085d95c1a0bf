"""What a model repository folder holds, read the way TF Serving reads it and the way Stoke does.

TF Serving takes every child of the model's base path whose name `strings::safe_strto64` parses for a
version (spaces around it, a leading '-', leading zeros, anything within int64; files and symbolic
links alike), serves the highest under its default policy, and loads it when it holds
`saved_model.pb` or `saved_model.pbtxt` (and no `export.meta`, the session bundles it refuses since
2.x). Stoke writes versions as plain decimal numbers in folders of their own. So each child is one of:

- a version: a folder named by ASCII digits without a leading zero, at most 2**63-1, that TF Serving
  can load; the only kind Stoke reads, compares with, serves from ROOT/serving, and ever retires;
- a partial: what Stoke's own interrupted push left (its `.push-<version>` temp folder; on an object
  store, which has no rename, also the version folder that marker names while it cannot be loaded);
- a stranger: anything else TF Serving takes for a version (a folder without a SavedModel, only
  `variables/`, a file, a symbolic link, `007`, `-1`, ` 7`), which the next change sets aside;
- anything else ('²', '０１', `notes`, 99999999999999999999, Stoke's own rolled-back-, set-aside-
  and _retired entries): TF Serving skips it, and Stoke leaves it as it is.
"""
from __future__ import annotations

import dataclasses
import posixpath
import re

from components.common.files import is_local

SAVED_MODEL = "saved_model.pb"
SAVED_MODEL_TEXT = "saved_model.pbtxt"
SERVING_FILES = (SAVED_MODEL, SAVED_MODEL_TEXT)  # either makes a folder loadable; copied last, removed first
SESSION_BUNDLE = "export.meta"
TEMP_PREFIX = ".push-"
MAX_VERSION = 2**63 - 1  # TF Serving's versions are int64 (ServableId, models.config's `versions:`)

# re's [0-9] is ASCII only, where str.isdigit() and int() also take '²', '٣' and '０１'.
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_SERVING_NUMBER = re.compile(r"[ \t\n\v\f\r]*-?[0-9]+[ \t\n\v\f\r]*")  # C's isspace and isdigit
_TEMP = re.compile(rf"{re.escape(TEMP_PREFIX)}([0-9]+)(?:-.*)?", re.DOTALL)
NOT_LOADABLE = f"it holds no {SAVED_MODEL} or {SAVED_MODEL_TEXT}, so TF Serving cannot load it"


def version_number(text: str) -> int | None:
    """`text` as a version number Stoke writes, or None."""
    return int(text) if _DECIMAL.fullmatch(text) and int(text) <= MAX_VERSION else None


def serving_reads(name: str) -> int | None:
    """The version TF Serving takes a child named `name` for, or None when it skips it."""
    if not _SERVING_NUMBER.fullmatch(name):
        return None
    number = int(name)  # int() takes the same spaces around
    return number if -MAX_VERSION - 1 <= number <= MAX_VERSION else None


def temp_number(name: str) -> int | None:
    """The version a `.push-<version>` leftover was for."""
    match = _TEMP.fullmatch(name)
    return version_number(match.group(1)) if match else None


def loadable(names) -> bool:
    """Whether a folder holding the files `names` is one TF Serving loads."""
    names = set(names)
    return bool(names & set(SERVING_FILES)) and SESSION_BUNDLE not in names


@dataclasses.dataclass(frozen=True)
class Survey:
    versions: list[int]  # oldest first
    partial: list[str]  # each version folder before the marker that names it
    strangers: dict[str, str]  # child name -> why it is no version of Stoke's
    in_flight: list[int]  # the numbers interrupted pushes had taken


def survey(fs, path: str) -> Survey:
    """Reads the folder `path` on `fs`: one listing, and one more per child TF Serving takes for a version."""
    if not fs.isdir(path):
        return Survey([], [], {}, [])
    entries = {posixpath.basename(entry["name"].rstrip("/")): entry for entry in fs.ls(path, detail=True)}
    temps = sorted(name for name in entries if name.startswith(TEMP_PREFIX))
    in_flight = sorted({number for number in map(temp_number, temps) if number is not None})
    versions, partial, strangers = [], [], {}
    for name, entry in sorted(entries.items()):
        read_as = serving_reads(name)
        if read_as is None:
            continue
        why = _why_not(fs, posixpath.join(path, name), name, entry, read_as)
        if why is None:
            versions.append(read_as)
        elif why == NOT_LOADABLE and read_as in in_flight and not is_local(fs):
            partial.append(name)  # a push copying onto an object store, stopped before saved_model.pb
        else:
            strangers[name] = why
    return Survey(sorted(versions), partial + temps, strangers, in_flight)


def _why_not(fs, path: str, name: str, entry: dict, read_as: int) -> str | None:
    """Why the child `name`, which TF Serving reads as version `read_as`, is no version of Stoke's; None if it is one."""
    if entry.get("islink"):
        return "it is a symbolic link; Stoke's versions are folders of their own"
    if entry.get("type") != "directory":
        return "it is a file, not a folder, so TF Serving cannot load it"
    if version_number(name) is None:
        return f"TF Serving reads its name as version {read_as}; Stoke names versions by plain decimal numbers"
    names = {posixpath.basename(child.rstrip("/")) for child in fs.ls(path, detail=False)}
    if SESSION_BUNDLE in names:
        return f"it holds {SESSION_BUNDLE}, a session bundle, which TF Serving no longer loads"
    return None if loadable(names) else NOT_LOADABLE
