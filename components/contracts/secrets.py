"""Credentials out of whatever Stoke stores or shows: `without_secrets` is the one scrubber, for a value
or a whole line; `recorded` is SOURCE, or a file of it, as every record names it; and `SourceCredentials`
keeps SOURCE's user info out of the names of its files.

A value a user gives (SOURCE, a --data-service address, a database URL, a queue) may carry a password,
and it comes back in files under ROOT, summaries, error lines, logs and Prefect's records. Every layer
reaches this one function: the error line, the summary and the log filter of every program
(components/common/program.py: `printable`, `scrubbed`), the run's recorded configuration (which
every stage program reads), manifests, lineage, and the messages that echo a value before any of those print it.

What is hidden is told by where it stands in a URL, not by what it holds or is called:
- the password of a URL's user info, in any scheme and without one (`user:password@host`, grpc's
  HOST:PORT spelling): inside an authority whatever runs from the user's `:` to a later `@` is a
  password, digits first or not (`bob:2024;Winter@host`); a port is only the digits after a host that
  end the authority (`host:8080`, then `/`, `?`, `#` or nothing). With a scheme it runs to the last `@`
  of the authority, over quotes, spaces, `:` and `/` (a password holding an unencoded `@` or `/`, as
  cloud secret keys do, goes whole); without one, to the end of its token (a space or `/`). A user info
  without a password is hidden whole (a token given as the user: `https://TOKEN@host`);
- a URL's query and fragment, whole, whatever their parameters are named (`?hmac=`, imgix's `?s=`, a
  signed URL inside another, `#access_token=`), in every scheme but the stores whose keys hold `?` and
  `#` as characters of a name (s3, gs, local paths); `recorded` leaves them out altogether. Files are
  guaranteed by this structure: SOURCE and its files are recorded so wherever they are written.
As a second net, for text that is no URL's query (a line, a path's parameters, a bucket key's query),
the value of every parameter (`name=`, after `?`, `&`, `;` or a space, in any case) and of every option
(`--name VALUE`) whose name says it is a credential: the names Datadog's default obfuscator hides (pass,
pwd, secret, token, api/access key, sign/signed/signature, auth/authorization, bearer, session ids,
sid, jwt: libddwaf's OBFUSCATOR_DEFAULT_KEY_REGEX), the presigned-URL keys OpenTelemetry's URL
conventions redact (AWSAccessKeyId, Signature, sig, X-Goog-Signature: semantic-conventions
docs/url/url.md), X-Amz- and X-Goog-Credential, OAuth 2.0's authorization `code` (RFC 6749 4.1.2), `pw`,
and any `key`. A list can miss a name; the structure cannot.
What is kept: user names beside a password, hosts, ports, paths, a bucket key's other parameters. Text
that only looks like a credential loses more than it needs to; nothing leaks. `host:8080/a@b` is a port
and a path, not a password (no URL parser reads a `/` inside a password).
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from functools import lru_cache

from components.contracts.buckets import STORES

HIDDEN = "***"
# SOURCE as it was given, credentials and all: the one place it is handed from process to process.
# Files, command lines and Prefect's parameters get SOURCE without its secrets (components/contracts/
# program.py and flows/ put it back from here).
SOURCE_ENV = "STOKE_SOURCE"

# `host:8080/...`: a port is the digits after a host that end the authority (a path, query or fragment
# follows, or nothing). Digits followed by anything else (`bob:2024;Winter@host`) start a password.
_PORT = r"\d{1,5}(?:[/?#]|$)"
# scheme://user:password@ : the password runs to the first @ (not into another URL), then over every
# further @ of the authority (`me:p@ss w@rd@host`): an @ after a `/`, `?` or `#` is a path's. The URL
# patterns start at `://`, whatever the scheme: a literal the matcher jumps to (5 us a URL, not 30). A
# user holds no `[`: `http://[::1]:8080` is an IPv6 host.
_URL_PASSWORD = re.compile(rf"(?P<lead>://[^\s/?#@:\[]*):(?!{_PORT})(?:(?!://)[^@\n])*@(?:[^@\n/?#]*@)*")
# scheme://token@ : a user info without a password is hidden whole.
_URL_USER = re.compile(rf"(?P<lead>://)(?!{re.escape(HIDDEN)}@)[^\s/?#@:]+@(?:[^@\s/?#]*@)*")
# user:password@host without a scheme, where a token starts; the password ends at a space or a `/`.
_BARE_PASSWORD = re.compile(
    r"(?<![^\s'\"(=,\[])(?P<lead>[^\s'\"/?#@:=,()\[\]]+):(?!" + _PORT + r")[^\s/@]*@(?:[^@\s/?#]*@)*(?=[A-Za-z0-9\[])")
# A URL's query and fragment: from the first `?` or `#` after its authority to the end of the URL in a
# line (a space, a quote, `<` or `>`). Every scheme has them but the stores whose keys hold `?` and `#`
# as characters of a name (`s3://b/a?b.png`, `gs://b/#1.png`, a local file), and `#rowN` is a name:
# ingest's for a manifest's row that names no file.
_LITERAL_SCHEMES = ("file", "local", *STORES)
_URL_QUERY = re.compile(r"://[^\s?#'\"<>]*(?P<mark>[?#])(?P<rest>[^\s'\"<>]*)")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_SCHEME_BEFORE = re.compile(rf"(?<![A-Za-z0-9+.-]){_SCHEME.pattern}\Z")
_ROW = re.compile(r"#row\d+")
_SECRET_NAMES = (r"[^=?&;#\s/'\"]*(?:pass|pwd|secret|token|key|credential|auth|sign|bearer|session|sessid|accessid|jwt)"
                 r"[^=?&;#\s'\"]*|pw|sig|sid|code")
_SECRET_PARAMETER = re.compile(rf"(?i)(^|[?&;\s'\"(,])({_SECRET_NAMES})=([^&;#\s]*)")
# `--s3_secret_access_key VALUE`: an option named so, its value the next token (a command line as a shell
# or a Python list spells it: `['--token', 'VALUE']`), unless that is another option. `--auth-string-file
# PATH` names a file that holds one.
_SECRET_OPTION = re.compile(rf"(?i)((?:^|[\s'\"(\[,])--(?!\S*file\b)(?:{_SECRET_NAMES})['\"]?(?:\s+|,\s*))"
                            r"(?!['\"]?-)('[^']*'|\"[^\"]*\"|[^\s'\",)\]]+)")


def without_secrets(text: str) -> str:
    """`text` with every password, user-info token, URL query and fragment and credential parameter or
    option it holds replaced by ***."""
    # Each pattern only where its literal is: most text (local paths, bucket keys) holds neither a user
    # info, a query, an option nor a parameter and costs five scans for one character each, not five
    # regular expressions: 0.2-0.3 us a name (100,000 local paths and bucket keys in 23 ms, side by side with
    # 10 ms when only `@` and `=` were looked for), where a URL with a user info or a query costs 4 to 9 us.
    if "@" in text:
        if "://" in text:
            text = _URL_USER.sub(rf"\g<lead>{HIDDEN}@", _URL_PASSWORD.sub(rf"\g<lead>:{HIDDEN}@", text))
        if ":" in text:
            text = _BARE_PASSWORD.sub(rf"\g<lead>:{HIDDEN}@", text)
    if ("?" in text or "#" in text) and "://" in text:
        text = _URL_QUERY.sub(_hidden_query, text)
    # Names are a second net, for what is no URL's query: `password=...` or `--password VALUE` in a line, a
    # path's parameters, a bucket key's (`s3://b/k?X-Amz-Signature=...`).
    if " " in text and "--" in text:  # an option and its value: two tokens
        text = _SECRET_OPTION.sub(rf"\1{HIDDEN}", text)
    return _SECRET_PARAMETER.sub(rf"\1\2={HIDDEN}", text) if "=" in text else text


def _hidden_query(found: re.Match) -> str:
    scheme = _SCHEME_BEFORE.search(found.string, max(0, found.start() - 40), found.start())
    if not (scheme and _queried(scheme.group())) or found["mark"] == "#" and _ROW.fullmatch("#" + found["rest"]):
        return found.group()
    return found.group()[:found.start("mark") - found.start() + 1] + HIDDEN


def _queried(scheme: str) -> bool:
    """Whether a URL of `scheme` has a query: no store's whose keys hold `?` and `#`."""
    return scheme.lower() not in _LITERAL_SCHEMES


def without_query(location: str) -> str:
    """`location` without its query and fragment (`?X-Amz-Signature=...`, `#access_token=...`): what names
    the file, the folder its neighbours are in and its kind (`m.csv`). Only a URL has one, and a URL of a
    store whose keys hold `?` and `#` (`s3://b/a?b.png`) or a local path (`a?token=1.png`) has none. The
    query starts after the user info, whose password may hold a `?`."""
    scheme, has_scheme, _ = location.partition("://")
    if not (has_scheme and _SCHEME.fullmatch(scheme) and _queried(scheme)):
        return location
    start = len(scheme)
    user = _URL_PASSWORD.match(location, start) or _URL_USER.match(location, start)
    mark = re.compile(r"[?#]").search(location, user.end() if user else start + 3)
    if mark is None or _ROW.fullmatch(location, mark.start()):
        return location
    return location[:mark.start()]


def recorded(location: str) -> str:
    """SOURCE, or a file of it, as Stoke records and shows it (config.json, Prefect's parameters, the
    manifest, every name of a file): without its query and fragment, which sign it or hold nothing a record
    needs, and without the credentials `without_secrets` hides. The process that reads it keeps it whole:
    SOURCE comes back from SOURCE_ENV (`given`), a file's query travels with the job (beam_jobs/sources.py)."""
    return without_secrets(without_query(location))


def has_secrets(text: str) -> bool:
    """Whether `text` holds something `without_secrets` hides."""
    return without_secrets(text) != text


def given(shown: str) -> str:
    """SOURCE as it was given, for a SOURCE as it is recorded and shown: SOURCE_ENV's value when `shown`
    is that value as recorded (or as a run recorded it before: with its query scrubbed), else `shown`
    itself. Raises ValueError for a SOURCE whose password was hidden and is not in the environment
    (reading it with *** would only be refused)."""
    real = os.environ.get(SOURCE_ENV, "")
    if real and recorded(real) == recorded(shown):
        return real
    if HIDDEN in shown and has_secrets(shown.replace(HIDDEN, "x")):
        raise ValueError(f"source {shown}: its credentials are kept out of files and Prefect; give SOURCE with "
                         f"them in the environment variable {SOURCE_ENV} of the run (or its worker)")
    return shown


@contextmanager
def source_for_workers(source: str):
    """SOURCE_ENV is `source` in the block: the job's workers, threads and the processes it starts,
    read SOURCE's files with its credentials (SourceCredentials.of_workers), which no file hands them."""
    before = os.environ.get(SOURCE_ENV)
    os.environ[SOURCE_ENV] = source
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SOURCE_ENV, None)
        else:
            os.environ[SOURCE_ENV] = before


class SourceCredentials:
    """The user info SOURCE was given with (`scheme://user:password@host`), held in memory only: the
    files listed under SOURCE are named without it (`hide`), which is how every record, index, manifest,
    dead letter and summary names them, and read with it (`reveal`), on SOURCE's own server only."""

    def __init__(self, source: str):
        after = source.find("://")  # SOURCE's own scheme, not a URL in its path
        match = (_URL_PASSWORD.match(source, after) or _URL_USER.match(source, after)) if after > 0 else None
        authority = re.match(r"[^/?#]*", source[match.end():]).group() if match else ""
        self.given = source[:match.end()] + authority if match else ""
        self.shown = without_secrets(self.given)

    @classmethod
    def of_workers(cls) -> SourceCredentials:
        """The credentials of the SOURCE this process's job reads (SOURCE_ENV), for a worker that
        opens its files by their names."""
        return _credentials(os.environ.get(SOURCE_ENV, ""))

    def hide(self, uri: str) -> str:
        return self.shown + uri[len(self.given):] if self.given and _under(uri, self.given) else uri

    def reveal(self, name: str) -> str:
        return self.given + name[len(self.shown):] if self.given and _under(name, self.shown) else name


def _under(uri: str, authority: str) -> bool:
    return uri.startswith(authority) and uri[len(authority):len(authority) + 1] in ("", "/", "?", "#")


@lru_cache(maxsize=4)
def _credentials(source: str) -> SourceCredentials:
    return SourceCredentials(source)
