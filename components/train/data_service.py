"""`stoke data-service dispatcher|worker`: tf.data service's own servers, for `stoke train --data-service`.

    stoke data-service dispatcher [--host 127.0.0.1] [--port 5050] [--work-dir URI]
    stoke data-service worker --dispatcher HOST:5050 [--host 127.0.0.1] [--port 5051]

The dispatcher hands out the splits of each epoch and keeps its state in --work-dir when given
(fault-tolerant mode: restarted on the same work dir, it resumes its jobs). A worker runs the input
pipelines it is given and serves their batches to the trainers. Both log their address on stderr,
run until SIGTERM or Ctrl-C, then stop and print a summary (with --json, one JSON line).

--host is the address each server is reached at: it must be one of this machine's, the worker
registers under it, and it is checked free before the server starts. TensorFlow's servers listen on
every interface of the machine whatever the host (tf.data service has no bind-address setting), and
their gRPC has no authentication: keep the ports behind a firewall, a NetworkPolicy or a container's
published port (infra/k8s/data-service.yaml, infra/compose.yaml).
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
import threading

from components.contracts import program
from components.contracts.config import DISPATCHER_PORT, WORKER_PORT, check_service_address

HEARTBEAT_MS = 2000  # how often a worker tells the dispatcher it is alive
WORKER_TIMEOUT_SECONDS = 30.0  # a worker silent this long is gone: its tasks leave the jobs
# How often the dispatcher looks for silent workers and finished jobs (TensorFlow's default, 10
# minutes, would keep a lost worker on the books that long).
CHECK_MS = 1000
_LEFT_RUNNING: list = []


class ServeError(RuntimeError):
    """A server that cannot start here; the message says why."""


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    prog = f"stoke data-service {args.role}"
    return program.main(prog, args.json, lambda: serve(args, prog), _describe, errors=(ServeError, OSError))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoke data-service", description=__doc__.strip().split("\n")[0])
    roles = parser.add_subparsers(dest="role", required=True, metavar="ROLE")
    dispatcher = roles.add_parser("dispatcher", help="hands the splits of each epoch to the workers")
    dispatcher.add_argument("--port", type=int, default=DISPATCHER_PORT, help=f"(default: {DISPATCHER_PORT}; 0: any free)")
    dispatcher.add_argument("--work-dir", default=None, help="folder or URI TensorFlow writes (gs://) for the "
                            "dispatcher's journal: a restart on it resumes the jobs (fault-tolerant mode)")
    dispatcher.add_argument("--worker-timeout", type=float, default=WORKER_TIMEOUT_SECONDS,
                            help=f"seconds without a heartbeat before a worker is gone (default: {WORKER_TIMEOUT_SECONDS:g})")
    worker = roles.add_parser("worker", help="runs the input pipelines and serves their batches")
    worker.add_argument("--dispatcher", required=True, help="HOST:PORT (or grpc://HOST:PORT) of the dispatcher")
    worker.add_argument("--port", type=int, default=WORKER_PORT, help=f"(default: {WORKER_PORT}; 0: any free)")
    for role in (dispatcher, worker):
        role.add_argument("--host", default="127.0.0.1", help="this machine's address that the server is reached "
                          "at (default: 127.0.0.1; in a pod, its IP)")
        role.add_argument("--json", action="store_true", help="print a JSON summary as the last line, after stopping")
    return parser


def serve(args: argparse.Namespace, prog: str) -> dict:
    """Starts the server, logs its address, and serves until SIGTERM or SIGINT; then stops it."""
    from components.train import service_input

    host = _checked_host(args.host, args.port)
    dispatcher = _address("--dispatcher", args.dispatcher) if args.role == "worker" else None
    from tensorflow.data.experimental import service  # after the checks: a typo answers in a moment

    if args.role == "dispatcher":
        config = service.DispatcherConfig(port=args.port, work_dir=args.work_dir, fault_tolerant_mode=bool(args.work_dir),
                                          worker_timeout_ms=int(args.worker_timeout * 1000),
                                          job_gc_check_interval_ms=CHECK_MS)
        server = service.DispatchServer(config)
        summary = {"role": "dispatcher", "address": f"grpc://{host}:{_port(server.target)}", "work_dir": args.work_dir}
    else:
        try:  # a worker registers with its dispatcher before it serves: a wrong address would hang there
            service_input.workers(dispatcher)
        except service_input.ServiceError as error:
            raise ServeError(str(error)) from None
        config = service.WorkerConfig(dispatcher_address=dispatcher.removeprefix("grpc://"), port=args.port,
                                      worker_address=f"{host}:%port%", heartbeat_interval_ms=HEARTBEAT_MS)
        server = service.WorkerServer(config)
        summary = {"role": "worker", "address": f"{host}:{_port(server._address)}", "dispatcher": dispatcher}
    print(f"{prog}: serving at {summary['address']} (stop with SIGTERM or Ctrl-C)", file=sys.stderr, flush=True)
    _wait_for_stop()
    if args.role == "dispatcher":
        server._stop()
    else:
        # A worker is left to end with the process: it keeps no state (the dispatcher hands its work to
        # others), and its stop (also its object's finalizer) holds Python's lock while it waits for its
        # tasks' readers, forever when the dispatcher is already gone. Kept referenced until os._exit.
        _LEFT_RUNNING.append(server)
    print(f"{prog}: stopped", file=sys.stderr, flush=True)
    return {**summary, "stopped": True}


def _wait_for_stop() -> None:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):  # a timed wait: the handler runs between waits
        pass


def _checked_host(host: str, port: int) -> str:
    """`host` (brackets added to an IPv6 address), once it is an address of this machine with `port` free."""
    if not 0 <= port < 65536:
        raise ServeError(f"--port {port}: a port from 0 (any free) to 65535 is needed")
    bare = host.strip("[]")
    try:
        family = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as error:
        raise ServeError(f"--host {host}: not an address this machine can resolve ({error})") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((bare, port))
        except OSError as error:
            why = ("another server holds it" if error.errno == errno.EADDRINUSE else
                   "not an address of this machine" if error.errno == errno.EADDRNOTAVAIL else error.strerror)
            raise ServeError(f"--host {host} --port {port}: cannot serve there: {why}") from None
    return f"[{bare}]" if family == socket.AF_INET6 else bare


def _address(flag: str, address: str) -> str:
    try:
        return check_service_address(address)
    except ValueError as error:
        raise ServeError(f"{flag}: {error}") from None


def _port(target: str) -> int:
    return int(target.rsplit(":", 1)[1])


def _describe(summary: dict) -> str:
    return f"{summary['role']} at {summary['address']} stopped"


if __name__ == "__main__":
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: finalizing the worker's server object would stop it, and wait (above)
