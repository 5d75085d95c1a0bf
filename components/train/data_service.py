"""`stoke data-service dispatcher|worker`: tf.data service's own servers, for `stoke train --data-service`.

    stoke data-service dispatcher [--host 127.0.0.1] [--port 5050] [--work-dir URI] [--trusted-network]
    stoke data-service worker --dispatcher HOST:5050 [--host 127.0.0.1] [--port 5051] [--trusted-network]
                              [--dispatcher-wait 300]

The dispatcher hands out the splits of each epoch and keeps its state in --work-dir when given
(fault-tolerant mode: restarted on the same work dir, it resumes its jobs). A worker runs the input
pipelines it is given and serves their batches to the trainers; started before its dispatcher answers
(pods start in any order), it waits for it, as TensorFlow's own worker would, up to --dispatcher-wait
seconds. Both log their address on stderr, run until SIGTERM or Ctrl-C, then stop and print a summary
(with --json, one JSON line).

What a peer can do: tf.data service's gRPC has no authentication, and TensorFlow's servers listen on
every interface of the machine, IPv4 and IPv6, whatever --host says (below: who can reach it). Any peer that
reaches the dispatcher's or a worker's port can have the workers run a dataset graph of its own, and
so any TensorFlow op: read and write every file the worker's user can (ReadFile, WriteFile), and
have a server write profiler traces into a folder the peer names.

So by default a server starts only where no other host reaches it: with a loopback --host, on a
machine (a network namespace, a container without a network) whose only interface that is up is
loopback; it stops if another one comes up while it serves. --trusted-network serves on a network:
--host is then the address of this machine the trainers and workers reach it at (the worker
registers under it), and the network must admit them alone (a firewall, a NetworkPolicy, an
unpublished container network: infra/k8s/data-service.yaml, infra/compose.yaml).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import ipaddress
import os
import signal
import socket
import struct
import sys
import threading
import time

import grpc

from components.common import program
from components.contracts.config import DISPATCHER_PORT, WORKER_PORT, check_service_address

HEARTBEAT_MS = 2000  # how often a worker tells the dispatcher it is alive
WORKER_TIMEOUT_SECONDS = 30.0  # a worker silent this long is gone: its tasks leave the jobs
# How often the dispatcher looks for silent workers and finished jobs (TensorFlow's default, 10
# minutes, would keep a lost worker on the books that long).
CHECK_MS = 1000
ANSWER_SECONDS = 10.0  # how long the dispatcher has to answer GetWorkers
# How long a worker waits for a dispatcher that does not answer yet: long enough for its pod to be
# scheduled, its image pulled and TensorFlow loaded; a wrong address still fails, in one line.
DISPATCHER_WAIT_SECONDS = 300.0
MAX_DISPATCHER_WAIT_SECONDS = 24 * 60 * 60.0
RETRY_SECONDS = 1.0
# gRPC's codes for "nothing answers there": refused, no such host yet, no answer in time.
NO_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"
_LEFT_RUNNING: list = []
PEERS_CAN = "run TensorFlow ops on the workers, reading and writing their files, with no authentication"
EXPOSED = ("TensorFlow's server listens on every interface of this machine whatever --host, where any peer "
           f"that reaches its port can {PEERS_CAN}")
TRUSTED_HELP = (f"serve on a network: {EXPOSED}. Give it only where the network admits nothing but the trainers "
                "and this service's servers (a firewall, a NetworkPolicy). Without it a server starts only with a "
                "loopback --host where no interface but loopback is up, and stops if one comes up")


class ServeError(RuntimeError):
    """A server that cannot start here; the message says why."""


class ServiceError(RuntimeError):
    """A dispatcher that does not answer, or has no workers; the message says which."""


class NoAnswer(ServiceError):
    """Nothing answers at the dispatcher's address, or not in time: it may not have started yet."""

    def __init__(self, address: str, why: str):
        super().__init__(f"no tf.data service dispatcher answers at {address}: {why}")
        self.address, self.why = address, why


def run(argv: list[str] | None = None) -> int:
    with _stop_on_signals() as stop:  # from the start: a SIGTERM while TensorFlow loads is not lost
        args = _parser().parse_args(argv)
        prog = f"stoke data-service {args.role}"
        return program.main(prog, args.json, lambda: serve(args, prog, stop), _describe, errors=(ServeError, OSError))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoke data-service", description=__doc__.strip().split("\n")[0])
    roles = parser.add_subparsers(dest="role", required=True, metavar="ROLE")
    role_help = {"dispatcher": "hands the splits of each epoch to the workers",
                 "worker": "runs the input pipelines and serves their batches"}
    dispatcher, worker = (roles.add_parser(name, help=text, description=f"{text}. {EXPOSED}. Without "
                                           "--trusted-network it starts only where no other host reaches it.")
                          for name, text in role_help.items())
    dispatcher.add_argument("--port", type=int, default=DISPATCHER_PORT, help=f"(default: {DISPATCHER_PORT}; 0: any free)")
    dispatcher.add_argument("--work-dir", default=None, help="folder or URI TensorFlow writes (gs://) for the "
                            "dispatcher's journal: a restart on it resumes the jobs (fault-tolerant mode)")
    dispatcher.add_argument("--worker-timeout", type=float, default=WORKER_TIMEOUT_SECONDS,
                            help=f"seconds without a heartbeat before a worker is gone (default: {WORKER_TIMEOUT_SECONDS:g})")
    worker.add_argument("--dispatcher", required=True, help="HOST:PORT (or grpc://HOST:PORT) of the dispatcher")
    worker.add_argument("--port", type=int, default=WORKER_PORT, help=f"(default: {WORKER_PORT}; 0: any free)")
    worker.add_argument("--dispatcher-wait", type=float, default=DISPATCHER_WAIT_SECONDS, metavar="SECONDS",
                        help="how long to wait for a dispatcher that does not answer yet before failing (default: "
                             f"{DISPATCHER_WAIT_SECONDS:g})")
    for role in (dispatcher, worker):
        role.add_argument("--host", default="127.0.0.1", help="the address of this machine the server is reached "
                          "at, not where it listens (default: 127.0.0.1; with --trusted-network, in a pod, its IP)")
        role.add_argument("--trusted-network", action="store_true", help=TRUSTED_HELP)
        role.add_argument("--json", action="store_true", help="print a JSON summary as the last line, after stopping")
    return parser


def serve(args: argparse.Namespace, prog: str, stop: threading.Event) -> dict:
    """Starts the server, logs its address, and serves until SIGTERM or SIGINT; then stops it."""
    dispatcher = _address("--dispatcher", args.dispatcher) if args.role == "worker" else None
    host = _checked_host(args.host, args.port, args.trusted_network)
    if dispatcher:
        # A worker registers with its dispatcher before it serves: a wrong address would hang there.
        _wait_for_dispatcher(dispatcher, args.dispatcher_wait, stop, prog)
    if stop.is_set():  # stopped while starting: nothing was served
        return _unserved(args.role)
    # Here, after the checks, not at the top: TensorFlow takes about 4 s to import (3.9 s measured on
    # this project's 2-core machines), and a typo in --host answers in a moment.
    from tensorflow.data.experimental import service

    if stop.is_set():  # while TensorFlow loaded
        return _unserved(args.role)
    server, summary = _start(service, args, host, dispatcher)
    reach = (f"on every interface of this machine (--trusted-network): any peer that reaches port "
             f"{_port(summary['address'])} can {PEERS_CAN}" if args.trusted_network else
             f"to this machine alone (no interface but loopback is up; one coming up stops it): any process here can "
             f"{PEERS_CAN}")
    print(f"{prog}: serving at {summary['address']} {reach} (stop with SIGTERM or Ctrl-C)", file=sys.stderr, flush=True)
    opened = _serve_until_stopped(stop, args.trusted_network)
    if args.role == "dispatcher":
        server._stop()
    else:
        # A worker is left to end with the process: it keeps no state (the dispatcher hands its work to
        # others), and its stop (also its object's finalizer) holds Python's lock while it waits for its
        # tasks' readers, forever when the dispatcher is already gone. Kept referenced until os._exit.
        _LEFT_RUNNING.append(server)
    if opened:
        raise ServeError(f"stopped: interface {', '.join(opened)} came up, and {EXPOSED}; give --trusted-network "
                         "to serve on a network")
    print(f"{prog}: stopped", file=sys.stderr, flush=True)
    return {**summary, "stopped": True}


def _wait_for_dispatcher(address: str, seconds: float, stop: threading.Event, prog: str) -> None:
    """Returns once the dispatcher at `address` answers, or once stopped. While nothing answers there it
    waits up to `seconds`, saying so once; ServeError past that, and at once for any other failure."""
    if not 0 <= seconds <= MAX_DISPATCHER_WAIT_SECONDS:  # nan too, which no deadline would ever pass
        raise ServeError(f"--dispatcher-wait {seconds:g}: seconds from 0 to {MAX_DISPATCHER_WAIT_SECONDS:g}")
    deadline = time.monotonic() + seconds
    said = False
    while not stop.is_set():
        try:
            workers(address)
            return
        except NoAnswer as error:
            unanswered = f"no tf.data service dispatcher answers at {error.address}"
            if time.monotonic() >= deadline:
                raise ServeError(f"{unanswered} after {seconds:g} s ({error.why}); start it (`stoke data-service "
                                 "dispatcher`), or wait longer with --dispatcher-wait") from None
            if not said:
                print(program.printable(f"{prog}: {unanswered} yet ({error.why}); waiting up to {seconds:g} s"),
                      file=sys.stderr, flush=True)
                said = True
        except ServiceError as error:
            raise ServeError(str(error)) from None
        stop.wait(RETRY_SECONDS)


def _unserved(role: str) -> dict:
    return {"role": role, "address": None, "stopped": True}


def _start(service, args: argparse.Namespace, host: str, dispatcher: str | None) -> tuple:
    """The running server, and its summary so far."""
    if args.role == "dispatcher":
        config = service.DispatcherConfig(port=args.port, work_dir=args.work_dir, fault_tolerant_mode=bool(args.work_dir),
                                          worker_timeout_ms=int(args.worker_timeout * 1000),
                                          job_gc_check_interval_ms=CHECK_MS)
        server = service.DispatchServer(config)
        return server, {"role": "dispatcher", "address": f"grpc://{host}:{_port(server.target)}", "work_dir": args.work_dir}
    config = service.WorkerConfig(dispatcher_address=dispatcher.removeprefix("grpc://"), port=args.port,
                                  worker_address=f"{host}:%port%", heartbeat_interval_ms=HEARTBEAT_MS)
    server = service.WorkerServer(config)
    return server, {"role": "worker", "address": f"{host}:{_port(server._address)}", "dispatcher": dispatcher}


@contextlib.contextmanager
def _stop_on_signals():
    """An event SIGTERM and SIGINT set, while the block runs. As PID 1 of a container, a process
    that has no handler yet drops SIGTERM: the kubelet would wait out the grace period."""
    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _serve_until_stopped(stop: threading.Event, trusted: bool) -> list[str]:
    """Waits for SIGTERM or SIGINT; or, serving this machine alone, for an interface to come up
    (returned: TensorFlow's server listens on it too)."""
    while not stop.wait(1.0):  # a timed wait: the handler runs between waits
        if not trusted and (opened := open_interfaces()):
            return opened
    return []


def _checked_host(host: str, port: int, trusted: bool) -> str:
    """`host` (brackets added to an IPv6 address), once it is an address of this machine with `port`
    free and, unless `trusted`, every address it stands for is loopback on a machine where only loopback is up."""
    if not 0 <= port < 65536:
        raise ServeError(f"--port {port}: a port from 0 (any free) to 65535 is needed")
    bare = host.strip("[]")
    try:
        addresses = resolve(bare, port)
    except (socket.gaierror, UnicodeError) as error:
        raise ServeError(f"--host {host}: not an address this machine can resolve ({error})") from None
    if any(ip(sockaddr).is_unspecified for _, sockaddr in addresses):
        raise ServeError(f"--host {host}: a wildcard is no address to reach a server at; give the address of this "
                         "machine the trainers and workers reach it at (the server listens on every interface anyway)")
    _probe(host, port, *addresses[0])  # the address a client of the name tries first
    if not trusted:
        _check_alone(host, addresses)
    return f"[{bare}]" if addresses[0][0] == socket.AF_INET6 else bare


def _probe(host: str, port: int, family: int, sockaddr: tuple) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(sockaddr)
        except OSError as error:
            why = ("another server holds it" if error.errno == errno.EADDRINUSE else
                   "not an address of this machine" if error.errno == errno.EADDRNOTAVAIL else error.strerror)
            raise ServeError(f"--host {host} --port {port}: cannot serve there: {why}") from None


def _check_alone(host: str, addresses: list[tuple]) -> None:
    """Without --trusted-network: no other host may reach the server."""
    foreign = sorted({str(ip(sockaddr)) for _, sockaddr in addresses if not ip(sockaddr).is_loopback})
    if foreign:
        named = host if foreign == [host.strip("[]")] else f"{host} ({', '.join(foreign)})"
        raise ServeError(f"--host {named} is not loopback: there any peer could {PEERS_CAN}; give --trusted-network "
                         "to serve on a network that admits only the trainers and workers")
    opened = open_interfaces()
    if opened:
        raise ServeError(f"interfaces besides loopback are up ({', '.join(opened)}), and {EXPOSED}: give "
                         "--trusted-network where the network admits only the trainers and workers (a firewall, a "
                         "NetworkPolicy), or serve in a network namespace or container whose only interface is loopback")


def _address(flag: str, address: str) -> str:
    try:
        return check_service_address(address)
    except ValueError as error:
        raise ServeError(f"{flag}: {error}") from None


def _port(target: str) -> int:
    return int(target.rsplit(":", 1)[1])


def _describe(summary: dict) -> str:
    if summary["address"] is None:
        return f"{summary['role']} stopped before serving"
    return f"{summary['role']} at {summary['address']} stopped"


# ---------------------------------------------------------------- asking the dispatcher (its own gRPC API)

def workers(address: str, timeout: float = ANSWER_SECONDS) -> list[str]:
    """The addresses of the workers registered with the dispatcher at `address` (grpc://HOST:PORT),
    asked over the dispatcher's own gRPC API."""
    with grpc.insecure_channel(address.removeprefix("grpc://")) as channel:
        ask = channel.unary_unary(_GET_WORKERS, request_serializer=bytes, response_deserializer=_worker_addresses)
        try:
            return ask(b"", timeout=timeout)  # GetWorkersRequest has no fields: its encoding is empty
        except grpc.RpcError as error:
            if error.code() in NO_ANSWER:
                raise NoAnswer(address, error.details() or error.code().name) from None
            raise ServiceError(f"no tf.data service dispatcher answers at {address}: "
                               f"{error.details() or error.code().name}") from None


def _worker_addresses(response: bytes) -> list[str]:
    """GetWorkersResponse: `repeated WorkerInfo workers = 1`, each with `string address = 1`."""
    return [address.decode() for number, worker in _fields(response) if number == 1
            for field, address in _fields(worker) if field == 1]


def _fields(message: bytes):
    """(field number, bytes) of each length-delimited field of a protobuf message; others skipped."""
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        kind = key & 7
        if kind == 2:
            length, at = _varint(message, at)
            yield key >> 3, message[at:at + length]
            at += length
        elif kind == 0:
            _, at = _varint(message, at)
        else:
            at += {1: 8, 5: 4}[kind]


def _varint(message: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = message[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


# ---------------------------------------------------------------- who can reach a server
# Who can reach a server of this machine that listens on every interface, as tf.data service's
# servers do: TensorFlow 2.21 has them listen on "0.0.0.0:PORT", which gRPC widens to [::]:PORT (IPv4
# and IPv6, every address of every interface), and neither its configs nor gRPC's environment take
# another bind address. So such a server is for this machine alone exactly when no interface but
# loopback is up, and its --host says only where it is reached, not where it listens.

_SIOCGIFFLAGS = 0x8913  # linux/sockios.h
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in its 24-byte union


def resolve(host: str, port: int) -> list[tuple]:
    """(family, sockaddr) of every address `host` stands for: a name can stand for several, and a
    number for one in a form that does not look like it ("0", "3221225986", "::ffff:10.0.0.1")."""
    return [(family, sockaddr) for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def ip(sockaddr: tuple) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address of `sockaddr`, an IPv4-mapped IPv6 address as the IPv4 address it carries."""
    address = ipaddress.ip_address(sockaddr[0].split("%")[0])
    return getattr(address, "ipv4_mapped", None) or address


def open_interfaces() -> list[str]:
    """The network interfaces other than loopback that are up: each takes connections from other
    hosts to every port this machine listens on. One that is down carries nothing until it comes up."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                request = struct.pack(_IFREQ, name.encode(), 0)
                flags = struct.unpack(_IFREQ, fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
            except OSError as error:
                if error.errno == errno.ENODEV:  # gone since it was listed
                    continue
                raise
            if flags & _IFF_UP and not flags & _IFF_LOOPBACK:
                found.append(name)
    return found


if __name__ == "__main__":
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: finalizing the worker's server object would stop it, and wait (above)
