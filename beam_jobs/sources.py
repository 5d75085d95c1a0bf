"""What a SOURCE holds: a folder of class subfolders, or a CSV/JSONL manifest of `uri,label[,split]`.

Listing happens once, on the machine that launches the job; workers only read the files it names.
A source file is known by its URI, size and version (ETag, generation or mtime), which is how a
later run tells new files from files that a published span already holds. Its URI is its name
without the credentials SOURCE was given with and without its URL's query and fragment
(components/contracts/secrets.py), so no record, index, manifest or dead letter holds them; it is read
with both (beam_jobs/local.py), the query from `Source.query`, which the job hands its workers in memory.
A row signed on its own (`a.jpg?hmac=...`) is so the file `a.jpg`: two rows that differ only in their
query name one file, read once, and the same file signed again on a later night is no new file.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import posixpath
import stat
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import fsspec

from beam_jobs import source_names
from beam_jobs.local import CHAINING, NOT_REGULAR, local_path, walk
from components.common import source_files, store_errors
from components.common.files import filesystem, is_local, is_uri, join, protocol, uri_of, version_of
from components.common.source_files import is_candidate
from components.common.store_errors import transient
from components.contracts.buckets import bucket_problem, store_of
from components.contracts.secrets import SourceCredentials, has_secrets, recorded, without_query

MANIFEST_SUFFIXES = (".csv", ".jsonl")
SPLIT_NAMES = {"train": "train", "eval": "eval", "validation": "eval"}
# The stores a manifest row may name, by the family each scheme belongs to; http://, ftp://,
# memory:// and the rest of fsspec's schemes are never read on a manifest's say-so.
LOCAL = fsspec.filesystem("file")
STORES = {"file": "file", "local": "file", "s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs"}


@dataclass(frozen=True)
class Source:
    uri: str
    size: int
    version: str
    label: str = ""  # class name; empty when the source gave none
    split: str = ""  # "train" or "eval"; empty until assigned
    key: str = ""  # what the split hash reads: the path below SOURCE, so a moved bucket splits alike
    fixed: bool = False  # the split is a manifest's: near-copies never move it
    query: str = ""  # the URL's query and fragment it is read with (a signature): never in a record or file

    @property
    def identity(self) -> tuple[str, int, str]:
        return (self.uri, self.size, self.version)

    def as_dict(self) -> dict:
        """What the job's staged lists hold (under ROOT): everything but the query."""
        # plain values: dataclasses.asdict deep-copies (0.5 s a 6,000-file listing)
        return {name: value for name, value in self.__dict__.items() if name != "query"}


@dataclass(frozen=True)
class Listing:
    sources: list[Source]
    rejected: list[tuple[Source, str]]  # files that cannot be ingested at all, with the reason
    skipped: list[tuple[str, str]] = field(default_factory=list)  # named, but no file of SOURCE: why

    def entries(self) -> Iterator[tuple[Source, str | None]]:
        """Every file listed, with the reason it is refused, or None."""
        yield from ((source, None) for source in self.sources)
        yield from self.rejected


def list_source(source: str, eval_fraction: float, allow_outside: bool = False) -> Listing:
    """Every image of SOURCE with its label and split; unusable entries with their reasons.

    A manifest's rows, and the links of a folder, name files under the source, unless `allow_outside`.
    A local SOURCE is read at its real path, however it is spelled."""
    return _collected(each_listed(source, eval_fraction, allow_outside))


def each_listed(source: str, eval_fraction: float, allow_outside: bool = False) -> Iterator[tuple[Source, str | None]]:
    """`list_source` one file at a time, each with the reason it is refused or None: a local folder
    is walked as it is read, so its listing is never in memory whole. Raises FileNotFoundError or
    ValueError for a SOURCE that cannot be listed at all, before the first file."""
    if CHAINING in source:
        raise ValueError(f"source {source}: '::' (fsspec's chaining) is not read; name a folder or a manifest")
    source_names.check_credentials(source)
    local = local_path(source)
    fs, path = filesystem(local) if local else filesystem(source)
    path = path if local else source_names.normalized(path)
    if local:
        _check_readable(source, local)
    elif not _in_store(source, fs, path):
        bucket = path.split("/", 1)[0]
        buckets = STORES.get(protocol(fs)) in ("s3", "gs")  # an http(s):// path is a whole URL: no bucket in it
        missing = f" (there is no bucket {bucket})" if buckets and bucket != path and not fs.exists(bucket) else ""
        raise FileNotFoundError(f"source {source} does not exist{missing}")
    if local and os.path.isdir(local):
        entries = _each_in_folder(local, allow_outside)
    elif fs.isdir(path):
        entries = _list_bucket_folder(fs, path).entries()
    elif without_query(path).lower().endswith(MANIFEST_SUFFIXES):  # a presigned URL's too
        entries = _list_manifest(fs, path, allow_outside, SourceCredentials(source)).entries()
    else:
        raise ValueError(f"source {source} is neither a folder nor a .csv/.jsonl manifest")
    credentials = SourceCredentials(source)
    named = (_named(s, reason, credentials) for s, reason in entries)
    return ((s if reason or s.split else _with_split(s, eval_fraction), reason) for s, reason in named)


def _named(source: Source, reason: str | None, credentials: SourceCredentials) -> tuple[Source, str | None]:
    """The listed file under its name; a file that is read keeps its URL's query to be read with."""
    query = "" if reason else source.uri[len(without_query(source.uri)):]
    uri, reason = source_names.named(source.uri[:len(source.uri) - len(query)], reason, credentials)
    return replace(source, uri=uri, query=query), reason


def _in_store(source: str, fs, path: str) -> bool:
    """Whether a bucket holds `path`; a refusal is raised naming its reason (components/common/store_errors.py)."""
    try:
        store_errors.info(fs, path)
    except FileNotFoundError as error:
        if transient(error):  # fsspec's HTTP files say "not found" for a connection refused or timed out too
            raise
        refusal = store_errors.server_refusal(error)  # and for a 401 or 403
        if refusal:
            raise PermissionError(f"source {source} was {refusal}: {store_errors.SERVER_REFUSED}") from None
        return False
    return True


def _check_readable(source: str, local: str) -> None:
    """Raises FileNotFoundError or PermissionError naming SOURCE: a walk would make a folder it cannot
    read one dead letter, and `exists` calls a path under a folder it may not enter missing."""
    try:
        status = os.stat(local)
        if stat.S_ISDIR(status.st_mode):
            os.scandir(local).close()
        elif stat.S_ISREG(status.st_mode):
            open(local, "rb").close()
    except FileNotFoundError:
        raise FileNotFoundError(f"source {source} does not exist") from None
    except (PermissionError, NotADirectoryError) as error:
        raise PermissionError(f"source {source} cannot be read: {(error.strerror or str(error)).lower()}") from None


def list_named(source: str, uris: list[str], eval_fraction: float = 0.0) -> Listing:
    """The files of a folder SOURCE that `uris` name (as bucket notifications do), listed as
    `list_source` lists them; what is outside SOURCE or gone goes to `skipped`, and what is not an
    image (hidden, a sidecar) is left out, as a listing leaves it out. Only the named files are read."""
    source_names.check_credentials(source)
    local = local_path(source)
    fs, base = (LOCAL, local) if local else filesystem(source)
    if base.lower().endswith(MANIFEST_SUFFIXES):
        raise ValueError(f"source {source} is a manifest: notifications name the files of a folder")
    base = source_names.normalized(base)
    fs.invalidate_cache()  # a file announced a moment ago is not in a listing cached before it
    found, skipped = [], []
    for uri in uris:
        path = _path_in(fs, uri)
        relative = posixpath.relpath(path, base) if path and path.startswith(base.rstrip("/") + "/") else None
        if relative is None:
            skipped.append((uri, f"not under {source}"))
        elif is_candidate(relative):
            found.append((uri_of(fs, path), relative))
    with ThreadPoolExecutor(max_workers=16) as pool:  # one metadata request per file on object stores
        infos = list(pool.map(lambda entry: _info(entry[0]), found))
    listed, rejected = [], []
    for (uri, relative), info in zip(found, infos):
        if info == "not found":
            skipped.append((uri, "not found: removed since it was announced"))
        elif isinstance(info, str):
            rejected.append((Source(uri, 0, ""), info))
        else:
            listed.append(Source(uri, int(info["size"]), version_of(info), key=relative))
    listing = _labelled(listed)
    credentials = SourceCredentials(source)
    named = _collected(_named(s, reason, credentials) for s, reason in listing.entries())
    sources = [_with_split(s, eval_fraction) for s in named.sources]
    return Listing(sources, named.rejected + [_named(s, r, credentials) for s, r in rejected],
                   [(recorded(credentials.hide(uri)), why) for uri, why in skipped])


def _path_in(fs, uri: str) -> str | None:
    """`uri` as a normalized path of the store `fs`, or None when it is of another store."""
    scheme, has_scheme, rest = uri.partition("://")
    if CHAINING in uri or (has_scheme and STORES.get(scheme.lower()) != _store(fs)) or (not has_scheme and not is_local(fs)):
        return None
    if is_local(fs):
        return os.path.realpath(rest if has_scheme else uri)
    return posixpath.normpath(rest)


def split_of(key: str, eval_fraction: float) -> str:
    """A deterministic split: the same path lands in the same split in every run and span."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "eval" if digest < eval_fraction * 2**64 else "train"


def _with_split(source: Source, eval_fraction: float) -> Source:
    return replace(source, split=split_of(source.key, eval_fraction))


def _each_in_folder(base: str, allow_outside: bool) -> Iterator[tuple[Source, str | None]]:
    """A local folder, walked by real paths (beam_jobs/local.py)."""
    for path, relative, entry in walk(base, allow_outside, is_candidate):
        if isinstance(entry, str):
            yield Source(path, 0, ""), entry
        else:
            yield _label(Source(path, int(entry.st_size), str(entry.st_mtime), key=relative))


def _list_bucket_folder(fs, base: str) -> Listing:
    base = source_names.normalized(base)
    found = ((path, info) for path, info in sorted(fs.find(base, detail=True, withdirs=False).items())
             if is_candidate(posixpath.relpath(path, base)))
    return _labelled(Source(uri_of(fs, path), int(info["size"]), version_of(info), key=posixpath.relpath(path, base))
                     for path, info in found)


def _labelled(listed) -> Listing:
    return _collected(map(_label, listed))


def _label(source: Source) -> tuple[Source, str | None]:
    """Labels from the first folder below the source; a file directly in it has none."""
    if "/" not in source.key:
        return source, "not inside a class folder, so it has no label"
    return replace(source, label=source.key.split("/", 1)[0]), None


def _collected(entries: Iterable[tuple[Source, str | None]]) -> Listing:
    sources, rejected = [], []
    for source, reason in entries:
        if reason is None:
            sources.append(source)
        else:
            rejected.append((source, reason))
    return Listing(sources, rejected)


def _list_manifest(fs, path: str, allow_outside: bool, credentials: SourceCredentials) -> Listing:
    rows = _read_rows(fs, path)
    named = without_query(path)  # a presigned manifest's signature reads it, and only it
    folder = source_names.normalized(posixpath.dirname(named))
    sources, rejected, seen = [], [], set()
    entries = []
    for number, row in enumerate(rows, start=1):
        problem = row if isinstance(row, str) else _row_problem(row)
        if problem:
            rejected.append((Source(f"{uri_of(fs, named)}#row{number}", 0, ""), problem))
            continue
        given = row["uri"].strip()
        try:
            uri, key = resolve(fs, folder, given, allow_outside, credentials)
        except ValueError as refused:
            uri, reason = refused.args
            if without_query(uri) not in seen:
                seen.add(without_query(uri))
                rejected.append((Source(uri, 0, ""), reason))
            continue
        if without_query(uri) in seen:
            continue  # listed twice, maybe spelled or signed differently: ingest it once
        seen.add(without_query(uri))
        label = (row.get("label") or "").strip()
        split = (row.get("split") or "").strip().lower()
        if not label:
            rejected.append((Source(uri, 0, ""), "manifest row has no label"))
        elif split and split not in SPLIT_NAMES:
            rejected.append((Source(uri, 0, ""), f"unknown split {split!r}; use train or eval"))
        else:
            entries.append((uri, label, SPLIT_NAMES.get(split, ""), key))
    with ThreadPoolExecutor(max_workers=16) as pool:  # one metadata request per file on object stores
        infos = list(pool.map(lambda e: _info(e[0]), entries))
    for (uri, label, split, key), info in zip(entries, infos):
        if isinstance(info, str):
            rejected.append((Source(uri, 0, ""), info))
        else:
            sources.append(Source(uri, int(info["size"]), version_of(info), label, split, key=key, fixed=bool(split)))
    return Listing(sources, rejected)


def resolve(fs, folder: str, given: str, allow_outside: bool, credentials: SourceCredentials) -> tuple[str, str]:
    """A manifest row's file as (uri, split key), normalized so that every spelling of one path
    (`a.png`, `./a.png`, `img/../a.png`, absolute) is one URI and one key: the path below the
    manifest's folder; a local file by its real path, so a link must point inside too. A web server's
    file keeps its query (`a.png?hmac=...`), which reads it and which its name leaves out (`_named`).
    Raises ValueError(uri, reason) for a row that must not be read."""
    if CHAINING in given:
        raise ValueError(given, "'::' (fsspec's chaining) is not read: name one file")
    scheme, has_scheme, rest = given.partition("://")
    # Never sent anywhere, nor kept: its name is stored scrubbed (`_named`). A relative row's query, read
    # from a web server with it, is checked below as its store takes it (a bucket key's `?` is a name's).
    if has_secrets(given if has_scheme or given.startswith("/") else given.partition("?")[0].partition("#")[0]):
        raise ValueError(given, source_names.CREDENTIAL_IN_NAME)
    if has_scheme and scheme.lower() not in STORES:
        raise ValueError(given, f"scheme {scheme.lower()}:// is not read: local paths, s3:// and gs:// only")
    bad_bucket = bucket_problem(given)  # botocore would raise for it, deep in the listing's threads
    if bad_bucket:
        raise ValueError(given, bad_bucket)
    if store_of(given) and not rest.partition("/")[2].strip("/"):
        raise ValueError(given, f"names a bucket, not a file: write {scheme.lower()}://BUCKET/KEY")
    if has_scheme or given.startswith("/"):
        try:  # an absolute path is a local one, whatever the manifest's store; schemes in any case
            target, path = filesystem(f"{scheme.lower()}://{rest}" if has_scheme else given)
        except Exception as error:  # fsspec's errors for a URI it cannot parse vary by store
            raise ValueError(given, f"cannot be read: {error}") from None
    else:
        target, path = fs, join(folder, given)
    path = os.path.realpath(path) if is_local(target) else source_names.normalized(path)
    uri = uri_of(target, path)
    if has_secrets(credentials.hide(without_query(uri))):  # a credential in what would name it: never read
        raise ValueError(uri, source_names.CREDENTIAL_IN_NAME)
    inside = _store(target) == _store(fs) and (path == folder or path.startswith(folder.rstrip("/") + "/"))
    if not inside and not allow_outside:
        raise ValueError(uri, f"outside the manifest's folder {uri_of(fs, folder)}; --allow-outside-source reads it")
    return uri, posixpath.relpath(path, folder) if _store(target) == _store(fs) else path


def _store(fs) -> str:
    return "file" if is_local(fs) else STORES.get(protocol(fs), protocol(fs))


def _row_problem(row) -> str:
    """Why a parsed row cannot name a file, or "" when it can."""
    if not isinstance(row, dict):
        return f"manifest row is {type(row).__name__}, not an object with uri and label"
    if not (row.get("uri") or "") or (isinstance(row["uri"], str) and not row["uri"].strip()):
        return "manifest row has no uri"
    unknown = [str(key) for key in row if key not in source_files.COLUMNS]
    if unknown:
        return f"manifest row has the unknown key {unknown[0]}; its keys are uri,label[,split]"
    wrong = [k for k in source_files.COLUMNS if row.get(k) is not None and not isinstance(row[k], str)]
    return f"manifest row's {wrong[0]} is not a string" if wrong else ""


def _read_rows(fs, path: str) -> list[dict | str]:
    """The manifest's rows as dicts; a row that cannot be parsed as the reason (a dead letter).
    Raises ManifestError for a manifest without rows or without the columns (components/common/source_files.py)."""
    text, manifest = fs.cat_file(path).decode("utf-8-sig"), recorded(uri_of(fs, path))
    jsonl = without_query(path).lower().endswith(".jsonl")
    rows = _jsonl_rows(manifest, text) if jsonl else _csv_rows(manifest, text)
    if not rows:
        raise source_files.no_rows(manifest)
    return rows


def _jsonl_rows(manifest: str, text: str) -> list[dict | str]:
    rows = [_json_row(line) for line in text.splitlines() if line.strip()]
    first = next((row for row in rows if isinstance(row, dict)), None)
    if first is not None:  # its keys are the manifest's columns, as a CSV's header is
        source_files.check_keys(manifest, first)
    return rows


def _csv_rows(manifest: str, text: str) -> list[dict | str]:
    reader, rows, columns = csv.reader(io.StringIO(text)), [], None
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as error:  # a field over csv's limit (128 KB), a stray NUL: this row only
            rows.append(f"manifest line {reader.line_num} is not a CSV row: {error}")
            continue
        if not (row and any(cell.strip() for cell in row)):
            continue
        if columns is None:
            columns = source_files.header(manifest, row) if source_files.is_header(row) else ()
            if columns:
                continue
        names = columns or source_files.COLUMNS  # without a header: by position
        extra = [cell for cell in row[len(names):] if cell.strip()]
        rows.append(f"manifest line {reader.line_num} has {len(row)} cells; its columns are {','.join(names)}"
                    if extra else dict(zip(names, row)))
    return rows


def _json_row(line: str) -> dict | str:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as error:  # RecursionError: nesting deeper than the parser goes
        return f"manifest row is not valid JSON: {str(error)[:200] or type(error).__name__}"


def _info(uri: str) -> dict | str:
    """The file's metadata, or why it is refused before it is ever opened."""
    fs, path = filesystem(uri) if is_uri(uri) else (LOCAL, uri)  # a local path is literal: no chaining
    try:
        info = store_errors.info(fs, path)
    except Exception as error:
        reason = store_errors.refused(error, uri)
        if reason is None:  # a server away or busy, credentials no file would pass: the run fails, not the file
            raise
        return reason
    if info.get("type") == "directory":
        return store_errors.NOT_FOUND
    return info if info.get("type") == "file" else NOT_REGULAR
