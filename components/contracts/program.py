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
from components.contracts.secrets import without_secrets
from components.contracts.stages import stage
from components.contracts.summaries import Progress

BAD_SETTINGS = 2  # argparse's exit code for a command line it cannot use
FAILED = 1


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
    """The stage program's settings: its `--config` file, the options given laid over it, validated."""
    options = {dest: value for dest, value in vars(args).items() if dest not in ("config", "json")}
    data = overrides.read_file(args.config) if args.config else {}
    return program_model(stage(name)).model_validate(overrides.deep_merge(data, given(options)))


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
        return _fail(prog, as_json, os_error_line(error) if isinstance(error, OSError) else str(error), failed, FAILED)
    if isinstance(summary, Result):
        summary = summary.to_json()
    print(json.dumps(summary, sort_keys=True) if as_json else describe(printable(summary)), flush=True)
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
