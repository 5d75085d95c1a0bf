"""The edges every stage program shares: settings from a file and the command line, one-line errors,
progress events, and the summary as one JSON object on the last line of stdout, which is what
`stoke` and the flows read."""
from __future__ import annotations

import argparse
import errno
import json
import logging
import sys
import unicodedata
from collections.abc import Callable

from pydantic import ValidationError

from components.contracts import overrides
from components.contracts.options import add_options, given, option
from components.contracts.results import Result
from components.contracts.run_config import program_model
from components.contracts.secrets import given as given_source
from components.contracts.secrets import without_secrets
from components.contracts.stages import stage
from components.contracts.summaries import Progress

BAD_SETTINGS = 2  # argparse's exit code for a command line it cannot use
FAILED = 1
# sysexits.h's EX_TEMPFAIL: a failure another try may not meet (a timeout, throttling, a reset
# connection, a store's 5xx). The flow retries a stage that exits with it, and only such a stage: a
# bad path, missing or refused credentials, a bad manifest or setting fail the same way every time.
TRANSIENT = 75


def arguments(prog: str, doc: str) -> argparse.ArgumentParser:
    """A parser with `--json`, for a program that is not a stage (report, spans, rollback...)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.strip().split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    return parser


def stage_parser(name: str, positional=()) -> argparse.ArgumentParser:
    """A stage program's command line: `--config FILE` (the settings file the flow writes in the run
    folder, or one of your own), one option per setting over it, and `--json`. Built from the
    contracts alone, so `--help` answers before the program imports TensorFlow or Beam."""
    of = stage(name)
    parser = arguments(f"stoke {name}", of.settings.__doc__ or of.summary)
    parser.add_argument("--config", metavar="FILE", help="settings file (YAML or JSON; the flow writes "
                        f"ROOT/runs/<id>/config/{name}.json); options given here win over it")
    add_options(parser, program_model(of), positional, first=of.inputs)
    return parser


def stage_arguments(name: str, argv: list[str] | None = None) -> argparse.Namespace:
    return stage_parser(name).parse_args(argv)


def stage_settings(name: str, args: argparse.Namespace):
    """The stage program's settings: its `--config` file, the options given laid over it, validated.
    SOURCE is recorded without its credentials (the flow's settings file): they come from the
    environment (components/contracts/secrets.py)."""
    options = {dest: value for dest, value in vars(args).items() if dest not in ("config", "json")}
    data = overrides.read_file(args.config) if args.config else {}
    settings = program_model(stage(name)).model_validate(overrides.deep_merge(data, given(options)))
    if getattr(settings, "source", None):
        try:
            settings = settings.model_copy(update={"source": given_source(settings.source)})
        except ValueError as error:
            raise overrides.ConfigError(str(error)) from None
    return settings


def main(prog: str, as_json: bool, work: Callable[[], Result | dict], describe: Callable[[dict], str],
         errors: tuple[type[Exception], ...] = (), failed: Result | None = None) -> int:
    """Runs `work` and prints its summary, or one error line on stderr (and `failed` with the error
    as the JSON line) for bad settings and for the `errors` that mean the work could not be done."""
    try:
        summary = work()
    except ValidationError as error:
        return _fail(prog, as_json, settings_message(error), failed, BAD_SETTINGS)
    except overrides.ConfigError as error:
        return _fail(prog, as_json, str(error), failed, BAD_SETTINGS)
    except errors as error:
        message = os_error_line(error) if isinstance(error, OSError) else str(error)
        return _fail(prog, as_json, message, failed, TRANSIENT if transient(error) else FAILED)
    except Exception as error:
        if not transient(error):
            raise  # not the user's input nor the weather: a bug, whose traceback is what a report needs
        return _fail(prog, as_json, _last_line(error), failed, TRANSIENT)
    if isinstance(summary, Result):
        summary = summary.to_json()
    print(json.dumps(scrubbed(summary), sort_keys=True) if as_json else describe(printable(summary)), flush=True)
    return 0


def progress_printer(as_json: bool) -> Callable[[Progress], None]:
    """Shows a program's progress events: with --json one JSON line each on stdout (before the
    summary, which stays the last line), else a line for people on stderr: the stream of the
    moment it was made, since a Beam job holds back what its workers print to sys.stderr."""
    stream = sys.stderr

    def show(event: Progress) -> None:
        if as_json:  # one write: a line from another thread cannot land inside it
            sys.stdout.write(json.dumps(event.to_json(), sort_keys=True) + "\n")
            sys.stdout.flush()
        else:
            print(printable(event.describe()), file=stream, flush=True)

    return show


def printable(value):
    """`value` (a string, or the strings in a dict or list) fit to show: control and format
    characters escaped (a file name can hold terminal escapes, newlines or bidirectional overrides,
    and names reach terminals, logs and markdown reports), and passwords and credentials hidden
    (components/contracts/secrets.py: a URL a user gives can carry them)."""
    if isinstance(value, str):
        return without_secrets("".join(ch.encode("unicode_escape").decode("ascii")
                                       if unicodedata.category(ch) in _HIDDEN else ch for ch in value))
    if isinstance(value, dict):
        return {key: printable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable(item) for item in value]
    return value


def scrubbed(value):
    """`value` (a string, or the strings in a dict or list) without the credentials it holds: what a
    program prints as JSON is kept (summaries in the run folder) and shown (`--json`)."""
    if isinstance(value, str):
        return without_secrets(value)
    if isinstance(value, dict):
        return {key: scrubbed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrubbed(item) for item in value]
    return value


_HIDDEN = {"Cc", "Cf", "Zl", "Zp"}  # control, format (e.g. U+202E), line and paragraph separators


class PrintableLogs(logging.Filter):
    """Escapes every record's message (`printable`) before any handler sees it: console, file or a
    Prefect API handler. Tracebacks, formatted by handlers, are left as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = printable(record.getMessage()), ()
        return True


def escape_logs(*names: str) -> None:
    """Installs PrintableLogs on the loggers `names` (once each)."""
    for name in names:
        if not any(isinstance(f, PrintableLogs) for f in logging.getLogger(name).filters):
            logging.getLogger(name).addFilter(PrintableLogs())


def os_error_line(error: OSError) -> str:
    """`/root/runs/x cannot be written: read-only file system`: the path and what the system said,
    for the OSErrors a program turns into its one error line (a full disk, a read-only ROOT)."""
    path = error.filename if error.filename is not None else error.filename2
    why = (error.strerror or type(error).__name__).lower()
    if path is None:
        return str(error)
    if error.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT):
        return f"{path} cannot be written: {why}"
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"{path} cannot be written or read: {why} (check the owner and mode of ROOT)"
    return f"{path}: {why}"


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


def _last_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1].strip()}" if lines else type(error).__name__


def settings_message(error: ValidationError) -> str:
    """`--eval-fraction: Input should be less than 1` for each rejected setting."""
    return "; ".join(f"{option([str(part) for part in e['loc']])}: "
                     + ("no such setting" if e["type"] == "extra_forbidden" else e["msg"]) for e in error.errors())


def _fail(prog: str, as_json: bool, message: str, failed: Result | None, code: int) -> int:
    message = without_secrets(message)  # the JSON line too: whatever reads it may log it
    print(f"{prog}: error: {printable(message)}", file=sys.stderr, flush=True)
    if as_json:
        summary = type(failed).model_validate({**failed.to_json(), "error": message}).to_json() if failed else {
            "error": message}
        print(json.dumps(summary, sort_keys=True), flush=True)
    return code
