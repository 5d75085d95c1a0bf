"""SOURCE, before anything else: it exists, it can be read, and it holds what ingest reads.

A mistyped path, a folder this user may not read, a bucket that does not exist, credentials missing or
refused, a manifest without its columns: each fails here, first and within seconds, in one line with
its fix, instead of after the machine's checks and in ingest. The check looks at little: a local
folder is walked until its first image (at most WALK_LIMIT entries, so a folder of sidecars is told
from one of images), a bucket prefix is one request for one object, a manifest is read for its first
HEAD_BYTES (its columns checked as ingest reads them). A store that has not answered within
TIMEOUT_SECONDS fails the check as transient, which the flow retries.
"""
from __future__ import annotations

import os
import threading

from components.common import program, source_files, store_errors
from components.common.files import filesystem, is_local, uri_of
from components.contracts.secrets import without_query
from components.preflight.checks import Check

NAME = "source"
TIMEOUT_SECONDS = 30.0
WALK_LIMIT = 1000
HEAD_BYTES = 64 * 1024
MANIFEST_SUFFIXES = (".csv", ".jsonl")
LAYOUT = "SOURCE is a folder of class subfolders, or a .csv/.jsonl manifest of uri,label[,split]"


def source_check(source: str, timeout: float = TIMEOUT_SECONDS) -> Check:
    """SOURCE looked at in a thread of its own: a store that hangs fails the check after `timeout` s."""
    found: list[Check] = []
    worker = threading.Thread(target=lambda: found.append(_checked(source)), name="source check", daemon=True)
    worker.start()
    worker.join(timeout)
    if found:
        return found[0]
    return Check(NAME, "fail", f"{source} did not answer within {timeout:.0f} s",
                 "check the network and the store's endpoint (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST)",
                 {"transient": True})


def _checked(source: str) -> Check:
    """The check, with every way SOURCE cannot be read as a failed check (surprises: preflight's guard)."""
    try:
        return _look(source)
    except source_files.ManifestError as error:
        return _fail(str(error), "give the manifest these columns")
    except Exception as error:
        found = store_errors.problem(error, source)
        if found is not None:
            return _fail(found.summary, found.fix, found.transient)
        refusal = store_errors.server_refusal(error)
        if refusal:
            return _fail(f"{source} was {refusal}", store_errors.SERVER_REFUSED)
        if isinstance(error, FileNotFoundError):
            return _fail(f"{source} does not exist", f"check the path: {LAYOUT}")
        if isinstance(error, (PermissionError, NotADirectoryError)):
            return _fail(f"{source} cannot be read: {(error.strerror or str(error)).lower()}",
                         "make it readable by the user that runs Stoke")
        if isinstance(error, OSError):
            return _fail(program.os_error_line(error), f"check the path: {LAYOUT}", program.transient(error))
        raise


def _look(source: str) -> Check:
    if "::" in source:  # fsspec's chaining, which ingest refuses
        return _fail(f"{source}: '::' (fsspec's chaining) is not read", "name a folder or a manifest")
    fs, path = filesystem(source)
    if is_local(fs):
        path = os.path.realpath(path)
        status = os.stat(path)  # FileNotFoundError, PermissionError: named by _checked
        if os.path.isdir(path):
            return _local_folder(source, path)
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
        return _manifest(source, path, head, status.st_size <= HEAD_BYTES)
    info = store_errors.info(fs, path)  # one HEAD, or a listing of one key: the bucket and the credentials
    if info.get("type") == "directory":
        return Check(NAME, "ok", f"{uri_of(fs, path)} is a folder that can be listed", facts={"kind": "folder"})
    head = fs.cat_file(path, start=0, end=HEAD_BYTES)
    return _manifest(source, path, head, int(info.get("size") or 0) <= HEAD_BYTES)


def _local_folder(source: str, path: str) -> Check:
    """A folder: readable, and an image among its first WALK_LIMIT entries or none in it at all."""
    os.scandir(path).close()  # os.walk would swallow this folder's PermissionError and list nothing
    seen = 0
    for folder, dirs, files in os.walk(path, followlinks=True):  # links followed as ingest follows them
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        for name in files:
            if source_files.is_candidate(os.path.relpath(os.path.join(folder, name), path)):
                return Check(NAME, "ok", f"{source} is a folder that can be read, with images",
                             facts={"kind": "folder"})
        seen += len(files) + len(dirs)
        if seen >= WALK_LIMIT:
            return Check(NAME, "ok", f"{source} is a folder that can be read (no image among its first "
                         f"{seen} entries)", facts={"kind": "folder"})
    return _fail(source_files.no_images(source), "put the images in class folders: SOURCE/<label>/<image>")


def _manifest(source: str, path: str, head: bytes, whole: bool) -> Check:
    """A manifest: its first row (in `head`, the file's start; `whole`: all of it) has the columns."""
    kind = without_query(path).lower()  # a presigned manifest URL's name ends before its query
    if not kind.endswith(MANIFEST_SUFFIXES):
        return _fail(f"{source} is neither a folder nor a .csv/.jsonl manifest", LAYOUT)
    text = head.decode("utf-8-sig", errors="replace")
    lines = [line for line in text.splitlines(keepends=True) if line.strip()]
    if not lines and whole:
        raise source_files.no_rows(source)
    if lines and (whole or lines[0].endswith("\n")):  # a first row cut by HEAD_BYTES is left to ingest
        header = source_files.check_first_row(source, lines[0].rstrip("\r\n"), kind.endswith(".jsonl"))
        if header and whole and len(lines) == 1:
            raise source_files.no_rows(source)
    return Check(NAME, "ok", f"{source} is a manifest that can be read", facts={"kind": "manifest"})


def _fail(summary: str, fix: str, transient: bool = False) -> Check:
    return Check(NAME, "fail", summary, fix, {"transient": transient})
