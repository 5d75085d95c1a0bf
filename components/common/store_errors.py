"""A bucket's refusal as the one line a program prints: which store, which bucket, and what to set.

s3fs raises botocore's exceptions (NoCredentialsError, EndpointConnectionError) or turns a ClientError
into an OSError whose __cause__ it is; gcsfs raises google-auth's (DefaultCredentialsError, RefreshError),
its own HttpError, or `OSError("Forbidden: ...")`. "Unable to locate credentials" alone leaves a user
guessing whether SOURCE or ROOT failed and what to set where. Stage programs run their work inside
`naming(ROOT)` (ingest lists SOURCE inside `naming(SOURCE)`), which turns such an exception into a
StoreError; preflight's SOURCE check asks `problem` itself. Whether a retry could help is `transient`
below, the one rule the flow's retries follow (a program exits 75 for it, components/common/program.py).
"""
from __future__ import annotations

import errno
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from components.contracts.secrets import recorded, without_secrets

STORES = {"s3": "S3", "s3a": "S3", "gs": "GCS", "gcs": "GCS", "http": "HTTP", "https": "HTTP"}
S3_CREDENTIALS = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance role "
                  "provides them; for MinIO or another S3-compatible store also AWS_ENDPOINT_URL")
GCS_CREDENTIALS = ("set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or run `gcloud auth "
                   "application-default login`; for an emulator STORAGE_EMULATOR_HOST")
MISSING = {"NoCredentialsError", "PartialCredentialsError", "ProfileNotFound", "DefaultCredentialsError"}
REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
           "AuthorizationHeaderMalformed", "RefreshError"}
DENIED = {"AccessDenied", "AllAccessDisabled", "AccountProblem", "InvalidObjectState", "403"}


# What makes a failure transient, by class (module.name, anywhere in the exception's MRO), by the
# error code or HTTP status a store answered, and by errno. Names, not imports: a program that never
# touches a bucket does not load botocore or google-auth to classify its errors.
_DETERMINISTIC_CLASSES = {
    "botocore.exceptions.NoCredentialsError", "botocore.exceptions.PartialCredentialsError",
    "botocore.exceptions.ProfileNotFound", "botocore.exceptions.SSLError",
    "google.auth.exceptions.DefaultCredentialsError", "aiohttp.client_exceptions.ClientSSLError",
}
_TRANSIENT_CLASSES = {
    "botocore.exceptions.ConnectionError", "botocore.exceptions.HTTPClientError",  # connection, read timeout, reset
    "botocore.exceptions.IncompleteReadError", "requests.exceptions.ConnectionError", "requests.exceptions.Timeout",
    "requests.exceptions.ChunkedEncodingError", "urllib3.exceptions.ProtocolError", "urllib3.exceptions.TimeoutError",
    "aiohttp.client_exceptions.ClientConnectionError", "aiohttp.client_exceptions.ClientPayloadError",
    "google.auth.exceptions.TransportError", "google.auth.exceptions.TimeoutError",
}
TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
                   "RequestLimitExceeded", "TooManyRequestsException", "BandwidthLimitExceeded", "RequestTimeout",
                   "RequestTimeoutException", "ServiceUnavailable", "InternalError", "PriorRequestNotComplete"}
_TRANSIENT_ERRNOS = {errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EHOSTUNREACH,
                     errno.ENETUNREACH, errno.ENETDOWN, errno.EAGAIN, errno.EBUSY, getattr(errno, "EREMOTEIO", errno.EIO)}


def transient(error: BaseException) -> bool:
    """Whether another try might succeed where `error` failed. The first exception of its chain
    (the error, its cause, the cause's cause) that says decides: a `transient` attribute set where the
    error was made; credentials missing, a bad profile, a bad certificate (never); a store's answer,
    by its code (throttling, a timeout) or HTTP status (408, 429, 5xx); a connection refused, reset or
    timed out. Anything else is deterministic: a bad path, an access denied, a bad manifest, a bug."""
    for link in causes(error):
        verdict = getattr(link, "transient", None)
        if isinstance(verdict, bool):
            return verdict
        names = {f"{kind.__module__}.{kind.__qualname__}" for kind in type(link).__mro__}
        if names & _DETERMINISTIC_CLASSES:
            return False
        if getattr(link, "retryable", None) is True:  # google-auth's RefreshError says it itself
            return True
        code, status = store_answer(link)
        if code is not None or status is not None:
            return code in TRANSIENT_CODES or status in (408, 429) or (status or 0) >= 500
        if names & _TRANSIENT_CLASSES or isinstance(link, (ConnectionError, TimeoutError)):
            return True
        if isinstance(link, OSError) and link.errno in _TRANSIENT_ERRNOS:
            return True
    return False


def store_answer(error: BaseException) -> tuple[str | None, int | None]:
    """(error code, HTTP status) of a store's answer: botocore's ClientError, gcsfs's HttpError,
    google-api-core's errors, aiohttp's ClientResponseError; (None, None) for anything else."""
    response = getattr(error, "response", None)
    if isinstance(response, dict) and isinstance(response.get("Error"), dict):  # botocore's ClientError
        code = response["Error"].get("Code")
        code = None if code is None else str(code)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if not isinstance(status, int):
            status = int(code) if code and code.isdigit() else None  # a HEAD's answer has no body: "403"
        return code, status
    status = getattr(error, "code", None)
    if type(error).__module__.startswith(("gcsfs", "google.api_core")) and isinstance(status, int):
        return None, status
    status = getattr(error, "status", None)
    if type(error).__module__.startswith("aiohttp") and isinstance(status, int):  # a web server's answer
        return None, status
    return None, None


def causes(error: BaseException | None):
    """The error, then its cause (or the exception it was raised handling), and so on."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


@dataclass(frozen=True)
class Problem:
    """What failed on which bucket, and what fixes it; `transient` when another try may succeed."""

    summary: str
    fix: str
    transient: bool

    def __str__(self) -> str:
        return f"{self.summary}: {self.fix}"


class StoreError(OSError):
    """A store that refused or could not be reached; the message is the whole line (an OSError, so
    every program that lists OSError among its errors prints it as its one error line)."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem, self.transient = problem, problem.transient


@contextmanager
def naming(*uris: str):
    """Runs the block; a store's exception raised in it becomes a StoreError naming the bucket of
    `uris` on that store. Everything else passes unchanged, a StoreError from an inner block too."""
    try:
        yield
    except StoreError:
        raise
    except Exception as error:
        found = problem(error, *uris)
        if found is None:
            raise
        raise StoreError(found) from error


def on_root(work: Callable[[Any, Any], Any], settings: Callable[[], tuple[Any, Any]]) -> Callable[[], Any]:
    """A stage program's work, `work(config, facts)` on what `settings()` found, with a bucket's refusal
    naming ROOT's bucket."""
    def run():
        config, facts = settings()
        with naming(config.root):
            return work(config, facts)
    return run


def info(fs, path: str) -> dict:
    """fsspec's `info`, except that S3's answer to a HEAD, a bare 403 that cannot tell wrong credentials
    from a refusal, is replaced by the PermissionError of a GET of the same key, whose body names it
    (InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied)."""
    try:
        return fs.info(path)
    except PermissionError:
        try:
            fs.cat_file(path, start=0, end=1)
        except PermissionError as named:
            raise named  # its __cause__ is the ClientError that says which
        raise


NOT_FOUND = "not found"


def refused(error: BaseException, uri: str) -> str | None:
    """Why the one file `uri` cannot be read, as its dead letter says it, when another try would meet the
    same answer: not found (a missing key, a bucket that does not exist, a web server's 404 or 410, also
    after a redirect), access denied, or another status a web server answers for this file alone. None when
    a retry may succeed (a server away or busy, throttling) or when no file of the store could be read
    (credentials missing or refused): the run fails, to be retried or fixed, instead of refusing every file."""
    if transient(error):
        return None
    web = next((link for link in causes(error) if type(link).__module__.startswith("aiohttp")
                and isinstance(getattr(link, "status", None), int)), None)
    if web is not None:  # the status names the file's fate; the URL that answered, when a redirect led there
        answered = str(getattr(getattr(web, "request_info", None), "real_url", "") or "")
        # last: a URL runs to the end of the line (without its query: a redirect to a signed URL carries it)
        moved = f", redirected to {recorded(answered)}" if web.history and answered else ""
        kind = NOT_FOUND if web.status in (404, 410) else "refused"
        return f"{kind}: the server answered HTTP {web.status} {web.message}".rstrip() + moved
    names = {kind.__name__ for link in causes(error) for kind in type(link).__mro__}
    code, status = _answer(error)
    if names & (MISSING | REFUSED) or code in REFUSED or status == 401:
        return None
    if code == "NoSuchBucket":
        return f"{NOT_FOUND}: there is no bucket {uri.split('://', 1)[-1].split('/', 1)[0]}"
    if code in DENIED or status == 403 or (isinstance(error, PermissionError) and error.errno is None):
        # a store's refusal (s3fs gives it no errno); a local file's keeps its system message, below
        return f"access denied ({_said(error, code)})"
    if isinstance(error, FileNotFoundError):
        return NOT_FOUND
    if isinstance(error, OSError):
        return f"cannot be read: {error.strerror or error}"
    return None


SERVER_REFUSED = ("give SOURCE the credentials the server wants (https://USER:PASSWORD@host/...), or sign its "
                  "URL again if it was presigned (a signature expires)")


def server_refusal(error: BaseException) -> str | None:
    """A web server's refusal of a request (401, 403, ...) as `refused` words it; None for any other error,
    a 404 too: fsspec calls each of them FileNotFoundError, and "does not exist" misleads for a refusal."""
    reason = refused(error, "")
    return reason if reason and reason.startswith("refused: ") else None


def problem(error: BaseException, *uris: str) -> Problem | None:
    """The Problem `error` is on the bucket of `uris` it came from, or None when it is no store's
    credentials, permissions, missing bucket, answer or connection (a missing object, say)."""
    store = _store(error, uris)
    if store is None:
        return None
    where, code, status = _buckets(store, uris), *_answer(error)
    if store == "HTTP":  # no credentials or buckets to name: a server that is away or busy, or None
        return _http_problem(error, where, status)
    names = {kind.__name__ for link in causes(error) for kind in type(link).__mro__}
    said = _said(error, code)
    if names & MISSING or (store == "GCS" and status == 401 and "Anonymous caller" in said):
        return Problem(f"no {store} credentials for {where}" + ("" if "Unable to locate" in said else f" ({said})"),
                       _credentials(store), False)
    if code == "403":  # a HEAD's answer has no body to tell wrong credentials from a refusal
        return Problem(f"{store} refused access to {where} (403 Forbidden: wrong credentials, or ones that may not "
                       "read it)", f"{_credentials(store)}; {_grant(store)}", False)
    if code in REFUSED or names & REFUSED or status == 401:
        return Problem(f"{store} refused the credentials for {where} ({said})", f"check them: {_credentials(store)}",
                       transient(error))
    if code in DENIED or status == 403 or (store == "GCS" and str(error).startswith("Forbidden")):
        return Problem(f"{store} denied access to {where} ({said})", _grant(store), False)
    if code == "NoSuchBucket":
        return Problem(f"{store} {where} does not exist", "check its name" + _endpoint(store), False)
    if transient(error):
        what = f"{store} is busy or unavailable for {where}" if status else f"cannot reach {store} for {where}"
        return Problem(f"{what} ({said})", "check the network and the store's status" + _endpoint(store), True)
    return None


def _http_problem(error: BaseException, where: str, status: int | None) -> Problem | None:
    """A web server (an http(s):// SOURCE) that refused or dropped the connection, timed out or answered
    5xx, 408 or 429: transient. fsspec's HTTP files call each of these FileNotFoundError; its cause says which."""
    if not transient(error):
        return None
    said = f"HTTP {status}" if status else _said(list(causes(error))[-1], None)
    what = f"{where} is busy or unavailable" if status else f"cannot reach {where}"
    return Problem(f"{what} ({said})", "check the network and that the server is up", True)


def _store(error: BaseException, uris: tuple[str, ...]) -> str | None:
    """"S3" or "GCS": the library that raised it; else, for an error that names no local file (gcsfs's
    `OSError("Forbidden: ...")`, aiohttp's connection errors), the one bucket store among `uris`."""
    for link in causes(error):
        module = type(link).__module__
        if module.startswith(("botocore", "aiobotocore", "s3fs", "boto3")):
            return "S3"
        if module.startswith(("google", "gcsfs")):
            return "GCS"
    stores = {STORES[scheme] for scheme in map(_scheme, uris) if scheme in STORES}
    plain = type(error).__module__.startswith("aiohttp") or (
        isinstance(error, (OSError, TimeoutError)) and error.filename is None and error.filename2 is None)
    return stores.pop() if len(stores) == 1 and plain else None


def _buckets(store: str, uris: tuple[str, ...]) -> str:
    names = sorted({uri.split("://", 1)[1].split("/", 1)[0].rpartition("@")[2] for uri in uris
                    if STORES.get(_scheme(uri)) == store})
    kind = "host" if store == "HTTP" else "bucket"
    return f"{kind}{'s' * (len(names) > 1)} {' and '.join(names)}" if names else f"its {kind}s"


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def _answer(error: BaseException) -> tuple[str | None, int | None]:
    for link in causes(error):
        code, status = store_answer(link)
        if code is not None or status is not None:
            return code, status
    return None, None


def _said(error: BaseException, code: str | None) -> str:
    """The store's own words, one line: `InvalidAccessKeyId: The AWS Access Key Id ...`."""
    for link in causes(error):
        response = getattr(link, "response", None)
        message = response.get("Error", {}).get("Message") if isinstance(response, dict) else None
        if message:  # botocore's ClientError: its Message, without "An error occurred (...) when calling ..."
            return f"{code}: {message}" if code and not code.isdigit() else message
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = lines[-1] if lines else type(error).__name__
    return f"{code}: {said}" if code and not code.isdigit() and code not in said else said


def _credentials(store: str) -> str:
    return S3_CREDENTIALS if store == "S3" else GCS_CREDENTIALS


def _grant(store: str) -> str:
    if store == "S3":
        return ("grant the credentials in use s3:ListBucket and s3:GetObject on the bucket, and s3:PutObject and "
                "s3:DeleteObject under ROOT")
    return "grant the account in use roles/storage.objectViewer on the bucket, roles/storage.objectAdmin on ROOT's"


def _endpoint(store: str) -> str:
    """The endpoint a user set, which points bucket names at another store (MinIO, an emulator)."""
    name = "AWS_ENDPOINT_URL" if store == "S3" else "STORAGE_EMULATOR_HOST"
    return f" and {name} (now {without_secrets(os.environ[name])})" if os.environ.get(name) else ""
