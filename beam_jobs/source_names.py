"""How a file of SOURCE is named where Stoke stores and shows it (records, indexes, dead letters, the
manifest, summaries): its URI without the credentials SOURCE was given with (components/contracts/
secrets.py: SourceCredentials, which also reads it with them) and without its URL's query and fragment
(beam_jobs/sources.py keeps that apart, to read it with). A name that would still hold a credential is
refused before anything is read, and kept scrubbed as a dead letter."""
from __future__ import annotations

import posixpath

from components.common.files import is_uri
from components.contracts.secrets import SourceCredentials, has_secrets, recorded, without_query, without_secrets

CREDENTIAL_IN_NAME = ("its URI holds a credential (a user info, or a parameter named like a token or password) "
                      "that a span would store: never read; name the file without it, and give SOURCE the credentials")
BUCKETS = ("s3", "s3a", "gs", "gcs")


def check_credentials(source: str) -> None:
    """Raises ValueError for user info in a bucket URI: s3fs and gcsfs take credentials from their
    environment only, and would take `key:secret@bucket` for a bucket's name."""
    scheme = source.partition("://")[0].lower()
    if scheme in BUCKETS and SourceCredentials(source).given:
        raise ValueError(f"source {source}: {scheme}:// takes credentials from the environment (AWS_* variables, "
                         "~/.aws, Google's application default credentials), never from the URI")


def named(uri: str, reason: str | None, credentials: SourceCredentials) -> tuple[str, str | None]:
    """A listed file's name and the reason it is refused (None: it is read): its URI without SOURCE's user
    info, and without its query for a file refused (one that is read comes without it). A name that still
    holds a credential (a row's own user info, a token in a path or a link) is refused unread, under its
    name scrubbed; a reason never echoes one (a store's error quoting the URI it was given)."""
    if reason:  # stored, never read: whatever it holds that looks like a credential goes
        return recorded(credentials.hide(uri)), without_secrets(reason)
    if not is_uri(uri):
        return uri, None  # a local file's path is its name, however it looks (`a?token=1.png`)
    name = credentials.hide(uri)
    return (recorded(name), CREDENTIAL_IN_NAME) if has_secrets(name) else (name, None)


def normalized(path: str) -> str:
    """A store's path normalized (`a/./b`, `a/x/../b`), keeping a URL's `scheme://authority` and its query:
    an HTTP store's paths are whole URLs, and `..` never climbs out of their server."""
    scheme, has_scheme, rest = path.partition("://")
    if not has_scheme:
        return posixpath.normpath(path)
    authority, slash, below = rest.partition("/")
    query = path[len(without_query(path)):]  # a signature may hold a `/`, which is no folder
    below = below[:len(below) - len(query)]
    return f"{scheme}://{authority}" + (posixpath.normpath("/" + below) if slash else "") + query
