"""`stoke run` and `stoke up`: the `train` flow once, here; or the local stack that runs it for you.

    stoke run SOURCE --root ROOT [--config FILE] [--set GROUP.FIELD=VALUE ...]
                                    the train flow in this process, on an ephemeral Prefect server
                                    (or the one PREFECT_API_URL names); progress on the terminal
    stoke up --source S --root R [--config FILE] [--set ...]
                                    a Prefect server on 127.0.0.1 (SQLite under PREFECT_HOME) and
                                    the deployments of flows/deployments.py, until Ctrl-C
"""
from __future__ import annotations

import argparse
import atexit
import errno
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

from components.common import config_files, processes
from components.common.files import exists, is_uri, read_json
from components.common.program import BAD_SETTINGS, printable, scrubbed
from components.common.shard_cache import CacheError
from components.common.tf_files import folders_problem
from components.contracts.beam_options import BEAM_ARGS_ENV
from components.contracts.layout import Root, new_run_id
from components.contracts.run_config import RunConfig
from components.contracts.secrets import SOURCE_ENV, recorded, without_secrets
from flows.parameters import read_beam_args
from flows.run_options import (
    FIELDS,
    POLL_SECONDS_MAX,
    add_config_arguments,
    add_networks_argument,
    bounded,
    config_from,
    listed_networks,
)
from flows.work_pools import add_notifications_argument

SERVER_START_SECONDS = 120
# Prefect's ephemeral server answers within PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, 20 by default:
# less than a loaded 2-core machine takes to import it and migrate its database. `stoke run` waits this long
# unless the setting is set.
EPHEMERAL_START_SECONDS = 180
EPHEMERAL_LOG = "stoke-ephemeral-server.log"  # under PREFECT_HOME
PREFECT_PORT = 4200  # Prefect's own default; the API is at http://<host>:PREFECT_PORT/api
SERVER_STOP_SECONDS = 30
INTERRUPTED = 130  # a shell's code for a command Ctrl-C ended
AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"  # Prefect's own setting: basic auth on the API and UI

# ---------------------------------------------------------------- stoke run


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--run-id", default=None, help="run folder under ROOT/runs; the same id resumes a stopped run")
    parser.add_argument("--model-name", default=None, help=FIELDS["model_name"].description + " (default: stoke)")
    parser.add_argument("--no-preflight", dest="preflight", action="store_false",
                        help="skip the preflight checks (preflight: null)")
    parser.add_argument("--skip-unchanged", action="store_true",
                        help="end early, training nothing, when SOURCE holds nothing new and a model is served "
                             "(what the nightly and data-triggered runs do)")
    parser.add_argument("--json", action="store_true", help="print the run summary as JSON last")
    parser.epilog = ("Every setting of every stage is in the run configuration: `stoke config show` prints them all "
                     "with their help, and --config FILE / --set GROUP.FIELD=VALUE change them (docs/configuration.md).")


def run(args: argparse.Namespace) -> int:
    """Runs the train flow once and prints its summary; exit 0 also when the model was refused.
    SIGTERM stops it as Ctrl-C does: the stage running is stopped, then the temporary server."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        run_id, config = checked(args)
        if not os.environ.get("PREFECT_API_URL") and not os.environ.get("PREFECT_HOME"):
            os.environ["PREFECT_HOME"] = prefect_home(config.root)
    except (ValueError, config_files.ConfigError, CacheError) as error:
        print(f"stoke run: error: {printable(str(error))}", file=sys.stderr, flush=True)
        return BAD_SETTINGS
    signal.signal(signal.SIGTERM, _interrupt)  # a process manager's stop: the path Ctrl-C takes
    try:
        start_api()
        from flows.console import quiet_restated_failures
        from flows.pipeline import QUIET_FAILURES, pipeline

        quiet_restated_failures("train", errors=QUIET_FAILURES)  # a failure is this command's last line, once

        os.environ[SOURCE_ENV] = config.source  # the flow's parameter is SOURCE as recorded, without its credentials
        state = pipeline(**flow_parameters(config), skip_unchanged=args.skip_unchanged, run_id=run_id,
                         return_state=True)
    except ServerError as error:
        print(f"stoke run: error: {printable(str(error))}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"stoke run: stopped; run it again with --run-id {run_id} to resume", file=sys.stderr, flush=True)
        return INTERRUPTED
    if state.is_completed():
        summary = state.result()
    else:
        summary = _failed_summary(config.root, run_id, state)
        line = what_to_do(_failure_line(state, summary), config.root, run_again(args.command, run_id))
        print(f"stoke run: error: {printable(line)}", file=sys.stderr, flush=True)
    summary.setdefault("model_name", config.model_name)
    print(json.dumps(scrubbed(summary), sort_keys=True, default=str) if args.json else _describe(printable(summary)),
          flush=True)
    if state.is_completed():
        return 0
    from flows.pipeline import refused_settings

    return BAD_SETTINGS if refused_settings(state) else 1


def start_api() -> None:
    """The Prefect API of `stoke run`: the one PREFECT_API_URL names, else Prefect's own temporary server,
    started here as Prefect would start it on the flow's first call, but given EPHEMERAL_START_SECONDS (or
    the setting) to answer, with its output in PREFECT_HOME/stoke-ephemeral-server.log instead of on the
    terminal (and on stdout, whose last line is the summary). A server that does not answer is a
    ServerError naming the log."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return
    timeout = startup_timeout(settings)
    os.makedirs(str(settings.home), exist_ok=True)
    log_path = os.path.join(str(settings.home), EPHEMERAL_LOG)

    class TiedServer(SubprocessASGIServer):
        """Prefect's temporary server, started by Prefect's own command, but dying with this process however it
        dies (a `stoke run` killed outright would otherwise leave it running, holding a port and some 300 MB),
        and out of reach of a terminal's Ctrl-C, which stops the run first and the server after it, in order (the
        server gone first, the run spent minutes retrying it, printing tracebacks). Prefect's later calls for
        "the" temporary server get this one (its instances are kept by port)."""

        def _run_uvicorn_command(self):
            with processes.tied_children():
                return super()._run_uvicorn_command()

    server = TiedServer()
    with _output_to(log_path):
        try:
            server.start(timeout=timeout)
        except RuntimeError:  # Prefect's "Timed out while attempting to connect to ephemeral Prefect API server"
            server.stop()
            raise ServerError(f"the temporary Prefect server did not answer within {timeout} s; see {log_path} (raise "
                              "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or start one with `prefect server "
                              "start` and set PREFECT_API_URL)") from None
    # Stopped at exit after Prefect's log and event workers, registered later and so run earlier, have sent
    # what they hold; its goodbye goes to its log too.
    atexit.register(_stop_into, server, log_path)


def startup_timeout(settings) -> int:
    """Seconds the temporary server has to answer: PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS where it
    is set (environment or profile), else EPHEMERAL_START_SECONDS."""
    ephemeral = settings.server.ephemeral
    return ephemeral.startup_timeout_seconds if "startup_timeout_seconds" in ephemeral.model_fields_set \
        else EPHEMERAL_START_SECONDS


def _stop_into(server, log_path: str) -> None:
    with _output_to(log_path):
        server.stop()


@contextmanager
def _output_to(path: str):
    """File descriptors 1 and 2 write to `path` in the block: a process started in it writes there for life."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def checked(args: argparse.Namespace) -> tuple[str, RunConfig]:
    """The run id and the run configuration, checked before anything runs or is written."""
    if not args.preflight:  # --no-preflight is `--set preflight=null`, before the --set given
        args.overrides = ["preflight=null", *args.overrides]
    config = config_from(args, model_name=args.model_name)
    unreadable = folders_problem(config.shard_cache.dir)
    if unreadable:
        raise config_files.ConfigError(unreadable)
    run_id = args.run_id or new_run_id()
    try:
        Root(config.root).run(run_id)
    except ValueError as error:
        raise ValueError(f"--run-id: {error}") from None
    return run_id, config


def prefect_home(root: str) -> str:
    """The ephemeral Prefect server's home for runs into ROOT (its SQLite database): one per ROOT, so
    unrelated local runs never share a database or a queue (before Prefect is imported here)."""
    from components.common.cache_folder import default_folder, secure

    key = hashlib.sha256(_absolute(root).encode()).hexdigest()[:16]
    return os.path.join(secure(os.path.join(secure(default_folder()), "prefect")), key)


def flow_parameters(config: RunConfig) -> dict:
    """The train flow's parameters for `config`: its fields, groups as models (what they set is what the run was given).
    SOURCE as recorded, without its credentials and query, since Prefect records and shows a run's parameters:
    the flow takes SOURCE itself from STOKE_SOURCE (flows/pipeline.py)."""
    return {name: getattr(config, name) for name in FIELDS} | {"source": recorded(config.source)}


def _failed_summary(root: str, run_id: str, state) -> dict:
    """The run's report.json (written on failure too), else the state's message."""
    uri = Root(root).run(run_id).report_json
    if exists(uri):
        return read_json(uri)
    return {"run_id": run_id, "status": "failed", "message": state.message or state.name,
            "blessed": False, "pushed_version": None, "reasons": [], "metrics": {}}


def _failure_line(state, summary: dict) -> str:
    """A failed run's cause in one line (flows/pipeline.py failure_line), else the report's message."""
    from flows.pipeline import failure_line

    return failure_line(state) or str(summary["message"])


def what_to_do(line: str, root: str, again: str) -> str:
    """A failure `line` that says a disk is full (or over its quota), with what to do: free space where it names, under
    ROOT unless it names another place, then `again` (`run_again`)."""
    said = line.lower()
    if not any(os.strerror(number).lower() in said for number in (errno.ENOSPC, errno.EDQUOT)):
        return line
    under = any(f" {root.rstrip('/')}{after}" in f" {line}" for after in ("/", " "))  # a path of ROOT's, or ROOT
    where = "there" if " cannot be written: " in line and not under else "under ROOT"
    return f"{line}; free space {where}, then {again}"


def run_again(command: list[str], run_id: str) -> str:
    """How to take the same run up again: `stoke run` as it was given (`command`, its words from `stoke` on) with
    its run id, runnable as printed. A command that holds a credential is not printed (it would show the
    credential hidden, and fail as printed): what to add to it is."""
    given = any(word == "--run-id" or word.startswith("--run-id=") for word in command)
    if without_secrets(shlex.join(command)) != shlex.join(command):
        add = "" if given else f" with `--run-id {shlex.quote(run_id)}` added"
        return f"run the same command again{add} (it holds a credential, not printed here)"
    return f"run it again: `{shlex.join(command if given else [*command, '--run-id', run_id])}`"


def _describe(summary: dict) -> str:
    """The run's outcome and its report; a failed run's cause is the error line printed just before."""
    text = f"{summary.get('run_id')}: {summary.get('status')}"
    if summary.get("status") != "failed":
        text += f": {summary.get('message')}"
    if summary.get("report_md"):
        text += f"\nreport: {summary['report_md']}"
    return text


# ---------------------------------------------------------------- stoke up


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, source="option")
    add_networks_argument(parser)
    parser.add_argument("--port", type=bounded(int, 1, 65535), default=PREFECT_PORT,
                        help=f"port of the Prefect server and UI (default: {PREFECT_PORT})")
    parser.add_argument("--poll-seconds", type=bounded(float, 1, POLL_SECONDS_MAX), default=60,
                        help="how often watch-bucket lists SOURCE (default: 60)")
    parser.add_argument("--cron", default=None, help="schedule of train/nightly (default: '0 2 * * *', 02:00)")
    parser.add_argument("--timezone", default=os.environ.get("TZ") or "UTC",
                        help="IANA timezone of the schedule, e.g. Europe/Berlin (default: $TZ or UTC)")
    parser.add_argument("--beam-args-file", default=None,
                        help="Beam runner options of the deployment, one a line (e.g. infra/beam/dataflow.args)")
    add_notifications_argument(parser)
    parser.add_argument("--auth-string-file", default=None,
                        help=f"file holding user:password: the API and UI then ask for it (basic auth; also read from "
                             f"{AUTH_ENV})")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last, after shutdown")


def up(args: argparse.Namespace) -> int:
    """Starts the server, serves the deployments until Ctrl-C (or SIGTERM), then stops both."""
    try:
        config, networks = config_from(args), listed_networks(args)
        if _port_in_use(args.port):
            print(f"stoke up: error: port {args.port} on 127.0.0.1 is in use (another `stoke up` or Prefect "
                  "server?); choose another with --port", file=sys.stderr)
            return 1
        home, url = _server_environment(args)
        _check_schedule(args.cron, args.timezone)
    except config_files.ConfigError as error:
        print(f"stoke up: error: {printable(str(error))}", file=sys.stderr, flush=True)
        return BAD_SETTINGS
    config = config.model_copy(update={"source": _absolute(config.source), "root": _absolute(config.root)})
    os.environ[SOURCE_ENV] = config.source  # for the flow runs served here; deployments record it without secrets
    log_path = os.path.join(home, "stoke-server.log")
    signal.signal(signal.SIGTERM, _interrupt)  # `docker stop` / systemd: the same clean path as Ctrl-C
    server = None
    try:
        server = _start_server(args.port, log_path)
        print(_banner(args, config, home, url, log_path), flush=True)
        from flows.deployments import NIGHTLY_CRON, serve_deployments

        serve_deployments(config, poll_seconds=args.poll_seconds, cron=args.cron or NIGHTLY_CRON,
                          timezone=args.timezone, notifications=args.notifications, networks=networks)
    except KeyboardInterrupt:
        pass
    except ServerError as error:
        print(f"stoke up: error: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        if server is not None:
            processes.stop(server, SERVER_STOP_SECONDS)
    summary = {"api_url": f"{url}/api", "ui_url": url, "prefect_home": home, "source": recorded(config.source),
               "root": config.root, "deployments": ["train/nightly", "watch-bucket/poll"], "stopped": True}
    print(json.dumps(summary, sort_keys=True) if args.json else "stoke up: server and deployments stopped",
          flush=True)
    return 0


def _check_schedule(cron: str | None, timezone: str) -> None:
    """--cron and --timezone as Prefect will read them, before a server starts for them (Prefect is
    imported here, once the server's environment is set)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    from flows.deployments import NIGHTLY_CRON

    try:
        CronSchedule(cron=cron or NIGHTLY_CRON, timezone=timezone)
    except ValidationError as error:
        raise config_files.ConfigError(f"--cron {cron or NIGHTLY_CRON!r} --timezone {timezone!r}: "
                                    f"{config_files.said(error.errors()[0])}") from None


def _server_environment(args: argparse.Namespace) -> tuple[str, str]:
    """PREFECT_HOME and the server's URL, with the settings the server and every flow run inherit
    (set before Prefect is imported here)."""
    # The files first: one refused (ConfigError) leaves this process's environment as it was.
    beam_args = read_beam_args(args.beam_args_file) if args.beam_args_file else None
    auth = config_files.read_option_file(args.auth_string_file, "--auth-string-file").strip() if args.auth_string_file else None
    home = os.path.expanduser(os.environ.get("PREFECT_HOME") or "~/.prefect")
    os.makedirs(home, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    os.environ.update({"PREFECT_HOME": home, "PREFECT_API_URL": f"{url}/api",
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_API_HOST": "127.0.0.1",
                       "PREFECT_SERVER_API_PORT": str(args.port)})
    if beam_args is not None:  # flow runs start in processes of this one: they inherit it
        os.environ[BEAM_ARGS_ENV] = beam_args
    if auth is not None:
        os.environ[AUTH_ENV] = auth
    if os.environ.get(AUTH_ENV):  # the server checks it; this process and its flow runs send it
        os.environ["PREFECT_API_AUTH_STRING"] = os.environ[AUTH_ENV]
    return home, url


def _banner(args: argparse.Namespace, config: RunConfig, home: str, url: str, log_path: str) -> str:
    """What `stoke up` serves, what a run will train, its alerts, and how to start one by hand."""
    from flows.alerts import described
    from flows.deployments import NIGHTLY

    database = os.environ.get("PREFECT_SERVER_DATABASE_CONNECTION_URL") or os.path.join(home, "prefect.db")
    auth = "  export PREFECT_API_AUTH_STRING=<user:password>\n" if os.environ.get(AUTH_ENV) else ""
    train = config.resolved().train
    return (f"Prefect server: {url} (log: {log_path}; database: {without_secrets(database)})\n"
            + ("" if auth else f"No auth string: anyone who can reach 127.0.0.1:{args.port} can start runs "
               "(--auth-string-file)\n")
            + f"Serving train/nightly ({args.cron or 'cron 0 2 * * *'} {args.timezone}; and on stoke.data.arrived) "
            f"and watch-bucket/poll (every {args.poll_seconds:g} s"
            + (f", reading {args.notifications}" if args.notifications else "")
            + f") for {recorded(config.source)} -> {config.root}.\n"
            f"A run trains {train.network} at {train.image_size} px for "
            + (f"{train.epochs} epochs" if train.epochs else f"at least {train.min_steps} steps")
            + f" (preset {config.preset}; "
            "--preset, --config and --set change it). watch-bucket asks for a run as soon as SOURCE holds files "
            "no published span has, so the first one may start now.\n"
            f"{described(config, NIGHTLY)}.\n"
            f"From another shell:\n  export PREFECT_API_URL={url}/api\n{auth}  "
            f"{_prefect()} deployment run train/nightly\nCtrl-C stops both.")


def _prefect() -> str:
    """The `prefect` command beside this Python (in .venv/bin), as a user would type it."""
    beside = os.path.join(os.path.dirname(sys.executable), "prefect")
    return os.path.relpath(beside) if os.path.exists(beside) and not os.path.relpath(beside).startswith("..") \
        else beside


class ServerError(RuntimeError):
    pass


def _start_server(port: int, log_path: str) -> subprocess.Popen:
    log = open(log_path, "ab")
    # Its own process group: Ctrl-C reaches us, and we stop the server ourselves, in order. Killed
    # outright (SIGKILL, a container stop past its grace), we cannot: the kernel sends it SIGTERM.
    server = processes.start(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ServerError(f"the Prefect server exited with code {server.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    processes.stop(server, SERVER_STOP_SECONDS)
    raise ServerError(f"the Prefect server did not answer within {SERVER_START_SECONDS} s; see {log_path}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _absolute(uri: str) -> str:
    return uri if is_uri(uri) else os.path.abspath(uri)
