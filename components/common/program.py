"""The edges every stage program shares: settings from a file and the command line (one option per
setting, generated from its model), one-line errors, progress events, a temporary folder of its own, and
the summary as one JSON object on the last line of stdout, which is what `stoke` and the flows read."""
from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import unicodedata
from collections.abc import Callable, Iterator

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from components.common import config_files, network_code
from components.common.config_files import argument_type, leaves
from components.common.store_errors import causes, transient
from components.contracts import stages
from components.contracts.results import Result
from components.contracts.run_config import RunConfig, RunFacts, preset_problem
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
    """A stage program's command line: `--config FILE` (a run configuration: the flow's
    ROOT/runs/<id>/config.json, or one of your own), one option per setting over it, and `--json`. The
    options are the stage's group (`--epochs` is train.epochs), then the run-wide settings and the facts
    of the run the registry says it takes (`--root`, `--run-id`). Built from the contracts alone, so
    `--help` answers before the program imports TensorFlow or Beam."""
    of = stage(name)
    parser = arguments(f"stoke {name}", (of.settings and of.settings.__doc__) or of.summary)
    parser.add_argument("--config", metavar="FILE", help="run configuration (YAML or JSON; a run's "
                        "ROOT/runs/<id>/config.json reruns the stage as that run had it); options given here win over it")
    add_options(parser, RunConfig, positional, only=of.inputs)
    add_options(parser, RunFacts, only=of.inputs, under=(FACTS,))
    if of.settings is not None:
        add_options(parser, of.settings, under=(name,))
    return parser


def stage_arguments(name: str, argv: list[str] | None = None) -> argparse.Namespace:
    return stage_parser(name).parse_args(argv)


def stage_config(name: str, args: argparse.Namespace) -> tuple[RunConfig, RunFacts]:
    """The run configuration a stage program runs on, resolved once (its preset filled), and the facts
    of its run: its `--config` file, the options given laid over it, validated. SOURCE is recorded
    without its credentials (config.json): a stage that reads SOURCE takes them from the environment
    (components/contracts/secrets.py), and the others get no SOURCE at all."""
    options = given({dest: value for dest, value in vars(args).items() if dest not in ("config", "json")})
    facts = RunFacts.model_validate(options.pop(FACTS, {}))
    data = config_files.read_file(args.config) if args.config else {}
    config = RunConfig.model_validate(config_files.deep_merge(data, options)).resolved()
    hybrid = args.config and preset_problem(data, config.preset, args.config)
    if hybrid:
        raise config_files.ConfigError(hybrid)
    try:  # a file network beside the configuration (a run's config.json: the copy in its run folder)
        config = network_code.located(config, network_code.folder_of(args.config))
    except ValueError as error:
        raise config_files.ConfigError(str(error)) from None
    from components.common.tf_files import folders_problem  # here: the cache's module names its fix with ours

    unreadable = folders_problem(config.shard_cache.dir)
    if unreadable:
        raise config_files.ConfigError(unreadable)
    missing = [key for key in stage(name).required if getattr(config, key, None) is None and getattr(facts, key, None) is None]
    if missing:
        raise config_files.ConfigError("; ".join(f"{option(key)}: Field required" for key in missing))
    if "source" not in stage(name).inputs:
        config = config.model_copy(update={"source": None})
    elif config.source:
        try:
            config = config.model_copy(update={"source": given_source(config.source)})
        except ValueError as error:
            raise config_files.ConfigError(str(error)) from None
    return config, facts


def main(prog: str, as_json: bool, work: Callable[[], Result | dict], describe: Callable[[dict], str],
         errors: tuple[type[Exception], ...] = (), failed: Result | None = None) -> int:
    """Runs `work` and prints its summary, or one error line on stderr (and `failed` with the error
    as the JSON line) for bad settings and for the `errors` that mean the work could not be done. The work
    runs in a temporary folder of its own (`own_temporary_folder`)."""
    try:
        with own_temporary_folder(prog):
            summary = work()
    except ValidationError as error:
        return _fail(prog, as_json, settings_message(error), failed, BAD_SETTINGS)
    except config_files.ConfigError as error:
        return _fail(prog, as_json, str(error), failed, BAD_SETTINGS)
    except errors as error:
        message = os_error_line(error) if isinstance(error, OSError) else str(error)
        return _fail(prog, as_json, message, failed, TRANSIENT if transient(error) else FAILED)
    except Exception as error:
        full = unwritable(error)
        if full is not None:  # a full or read-only disk, in the words of whichever library met it
            return _fail(prog, as_json, os_error_line(full), failed, FAILED)
        if not transient(error):
            raise  # not the user's input nor the weather: a bug, whose traceback is what a report needs
        return _fail(prog, as_json, _last_line(error), failed, TRANSIENT)
    if isinstance(summary, Result):
        summary = summary.to_json()
    print(json.dumps(scrubbed(summary), sort_keys=True) if as_json else describe(printable(summary)), flush=True)
    return 0


@contextlib.contextmanager
def own_temporary_folder(prog: str) -> Iterator[str]:
    """A new folder under the temporary folder this process was given, made the temporary folder of this process
    (tempfile) and of the processes it starts (TMPDIR) while the block runs, and removed with all in it as the
    process exits, however it exits but killed: what a program and its libraries leave there goes with it.
    A Beam job handed to a job service (`--runner PortableRunner`, PrismRunner; Beam 2.77) leaves three or four
    folders on each job and never removes them; `beam-requirements-cache` among them is a cache of pip downloads
    Beam keeps for a `--requirements_file` (apache_beam/runners/portability/stager.py), which a deployment that
    stages one keeps across runs with Beam's own `--requirements_cache=FOLDER`. Removed at exit, not as the block
    ends: the exit handlers of what used it, registered later, run first (a Prism job server removes its own folder
    and stops its process in one, and does neither once its folder is gone). A program killed outright cannot
    remove its folder: the flow that started it does (flows/programs.py)."""
    try:
        folder = tempfile.mkdtemp(prefix=f"{prog.replace(' ', '-')}-")
    except OSError as error:
        raise config_files.ConfigError(f"the temporary folder {tempfile.gettempdir()} cannot be used: "
                                       f"{(error.strerror or type(error).__name__).lower()}; set $TMPDIR to a folder "
                                       "this user can write to") from None
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    given = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = folder
    try:
        yield folder
    finally:
        tempfile.tempdir = given[0]
        if given[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = given[1]


def lines_of(model: type[Result]) -> Callable[[dict], str]:
    """`main`'s `describe` for a summary that says itself: the lines its model logs (Result.log_lines)."""
    return lambda summary: "\n".join(line for _, line in model.model_validate(summary).log_lines())


def progress_printer(as_json: bool, terminal: bool | None = None) -> Callable[[Progress], None]:
    """Shows a program's progress events: with --json one JSON line each on stdout (before the
    summary, which stays the last line); else, when stdout is a terminal (`terminal`, by default asked of
    stdout), a bar on stderr (ProgressBar); else a line for people on stderr, as a log keeps them: the
    stream of the moment it was made, since a Beam job holds back what its workers print to sys.stderr."""
    if not as_json and (sys.stdout.isatty() if terminal is None else terminal):
        return ProgressBar()
    stream = sys.stderr

    def show(event: Progress) -> None:
        if as_json:  # one write: a line from another thread cannot land inside it
            sys.stdout.write(json.dumps(event.to_json(), sort_keys=True) + "\n")
            sys.stdout.flush()
        else:
            print(printable(event.describe()), file=stream, flush=True)

    return show


class ProgressBar:
    """Progress events as a bar on a terminal (rich's), redrawn at each event; `close` leaves it where it is,
    done, before anything is printed below it. On `console` when given (the console every other line goes
    through, such as Prefect's console handler's, whose lines then print above the bar), else on stderr as it
    is now (a Beam job later replaces sys.stderr)."""

    def __init__(self, console=None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        # Colours by name, not rich's theme styles (bar.back, progress.elapsed...): Prefect's console has a
        # theme of its own without them.
        self.progress = Progress(TextColumn("{task.description}"),
                                 BarColumn(style="grey37", complete_style="green", finished_style="green",
                                           pulse_style="green"),
                                 TextColumn("{task.completed:,.0f} of {task.total:,.0f} {task.fields[unit]} after "
                                            "{task.fields[seconds]:,.0f} s"),
                                 console=console or Console(file=sys.stderr),
                                 auto_refresh=False, redirect_stdout=False, redirect_stderr=False)
        self.task, self.lock = None, threading.Lock()  # events may come from a reporting thread (ingest's)

    def __call__(self, event: Progress) -> None:
        with self.lock:
            if self.task is None:
                self.progress.start()
                self.task = self.progress.add_task(printable(event.stage), total=event.total, unit=event.unit,
                                                   seconds=event.seconds)
            self.progress.update(self.task, completed=event.done, total=event.total, seconds=event.seconds)
            self.progress.refresh()

    def close(self, finished: bool = False) -> None:
        """Leaves the bar as it is, or full when the stage `finished` (its last event may come before its end)."""
        with self.lock:
            if self.task is not None:
                if finished:
                    self.progress.update(self.task, completed=self.progress.tasks[0].total)
                self.progress.stop()
                self.task = None


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
    program prints as JSON is kept (its result in the run folder) and shown (`--json`)."""
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
    if error.errno in UNWRITABLE:
        return f"{path} cannot be written: {why}"
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"{path} cannot be written or read: {why} (check the owner and mode of ROOT)"
    return f"{path}: {why}"


# A disk that takes no more: read-only, full, or over its quota.
UNWRITABLE = (errno.EROFS, errno.ENOSPC, errno.EDQUOT)
_WHY = "|".join(re.escape(os.strerror(number)) for number in UNWRITABLE)
# How errors that carry a system's error in words say it: TensorFlow's (`{{function_node ...}} PATH; No space left
# on device [Op:SaveV2]`), and Beam's of an OSError its worker raised on another thread (`OSError: [Errno 28] No
# space left on device: 'PATH' [while running 'WriteShards/ParDo(WriteShards)']`).
_IN_WORDS = (re.compile(rf"^(?:\{{\{{.*?\}}\}}\s*)?(?P<path>.+?); (?P<why>{_WHY})"),
             re.compile(rf"\[Errno \d+\] (?P<why>{_WHY})(?:: '(?P<path>[^']+)')?"))


def unwritable(error: BaseException) -> OSError | None:
    """The OSError of a disk that takes no more behind `error`, for os_error_line, one that names its file
    first; None when there is none. It is `error` or one in its chain (Beam raises its worker's as a
    RuntimeError while handling it), or the one an error of TensorFlow's or Beam's says in words."""
    found = []
    for link in causes(error):
        if isinstance(link, OSError):
            found += [link] if link.errno in UNWRITABLE else []
            continue
        text = str(getattr(link, "message", link))
        for said in (said for words in _IN_WORDS for said in words.finditer(text)):
            number = next(n for n in UNWRITABLE if os.strerror(n) == said["why"])
            found.append(OSError(number, said["why"], said["path"]))
    return next((e for e in found if e.filename is not None), found[0] if found else None)


def _last_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1].strip()}" if lines else type(error).__name__


def settings_message(error: ValidationError) -> str:
    """`--eval-fraction: Input should be less than 1` for each rejected setting: a stage group's field by
    its flag, which leaves the group out (ingest.eval_fraction is `stoke ingest --eval-fraction`); a rule
    between settings (no field of its own) by its message alone."""
    groups = {s.name for s in stages.STAGES}

    def one(e) -> str:
        where = [str(part) for part in e["loc"]]
        where = where[1:] if where[:1] and where[0] in groups else where
        if not where:
            return config_files.said(e)
        return f"{option(where)}: " + ("no such setting" if e["type"] == "extra_forbidden" else config_files.said(e))

    return "; ".join(one(e) for e in error.errors())


def _fail(prog: str, as_json: bool, message: str, failed: Result | None, code: int) -> int:
    message = without_secrets(message)  # the JSON line too: whatever reads it may log it
    print(f"{prog}: error: {printable(message)}", file=sys.stderr, flush=True)
    if as_json:
        summary = type(failed).model_validate({**failed.to_json(), "error": message}).to_json() if failed else {
            "error": message}
        print(json.dumps(summary, sort_keys=True), flush=True)
    return code


# ---------------------------------------------------------------- options from a settings model
# Each field is one option named after it (`shard_mb` -> `--shard-mb`), a nested group's fields by their path
# (`shard_cache.dir` -> `--shard-cache-dir`); its description is the help. Its dest is its path in the run
# configuration (`train.epochs`; a fact of the run under FACTS). Options left out stay out of the namespace
# (argparse.SUPPRESS), so `given` returns only what the command line said, to lay over a file.

SEPARATOR = "."  # in argparse's dest: the path of a field within nested groups
FACTS = "facts"  # the dests of a run's facts (run_config.RunFacts) start with it


def add_options(parser: argparse.ArgumentParser, model: type[BaseModel], positional=(), only=None, under=()) -> None:
    """One option per setting of `model` (the fields named in `only`, when given), or a positional
    argument; the dests are the settings' paths under `under`, the options without it."""
    for path, field in leaves(model):
        if only is not None and path[0] not in only:
            continue
        dest, flag = SEPARATOR.join((*under, *path)), option(path)
        kind, choices = argument_type(field.annotation)
        help_text = (field.description or "") + _default(field)
        if path[0] in positional:
            parser.add_argument(dest, type=kind, nargs="?", default=argparse.SUPPRESS, help=help_text)
        elif kind is bool:
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=dest, type=kind, choices=choices, default=argparse.SUPPRESS,
                                metavar=None if choices else dest.rsplit(SEPARATOR, 1)[-1].upper(), help=help_text)


def given(options: dict) -> dict:
    """The settings the command line gave (argparse's dests and values), nested by path:
    {"shard_cache": {"dir": ...}, "epochs": 3}."""
    found: dict = {}
    for dest, value in options.items():
        *groups, name = dest.split(SEPARATOR)
        node = found
        for group in groups:
            node = node.setdefault(group, {})
        node[name] = value
    return found


def option(path) -> str:
    """The option of a setting: ("shard_cache", "max_gb") or "max_gb" -> --shard-cache-max-gb."""
    parts = [path] if isinstance(path, str) else path
    return "--" + "-".join(parts).replace("_", "-")


def setting_hint(stage: str | None, values: dict) -> str:
    """Settings as a hint shows them, each form runnable as printed by the command it is for: `--set
    GROUP.FIELD=VALUE` for `stoke run` (and `stoke up`, `stoke deploy`), then the stage's program by hand.
    `values` maps a setting's path (`train.image_cache`) to its value (text, a number or a bool):
    `--set train.image_cache=memory` (by hand: `stoke train --image-cache memory`). Without a `stage` (a
    run-wide setting that several programs take) the hand form is the option alone."""
    overrides, flags = [], []
    for path, value in values.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        overrides.append(f"--set {path}={text}")
        parts = path.split(SEPARATOR)
        flag = option(parts[1:] if parts[0] == stage else parts)
        if isinstance(value, bool):
            flags.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            flags.append(f"{flag} {text}")
    command = f"stoke {stage} " if stage else ""
    return f"`{' '.join(overrides)}` (by hand: `{command}{' '.join(flags)}`)"


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return " (required)"
    if field.default is None:  # the description says what happens
        return ""
    return f" (default: {field.default})"
