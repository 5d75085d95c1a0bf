"""Who reaches `stoke data-service`'s servers: real dispatcher and worker processes, and a peer in a
network namespace of its own joined to this machine by a veth pair, as another host on its network.
TensorFlow's servers listen on every interface whatever --host: by default a server starts only where
no interface but loopback is up, and with --trusted-network it says that it is on the network."""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.components.train import namespaces
from tests.waiting import free_port, wait_for

PROGRAM = [sys.executable, "-m", "components.train.data_service"]
EXPOSED = "can run TensorFlow ops on the workers, reading and writing their files"


@dataclasses.dataclass
class Program:
    process: subprocess.Popen
    lines: list  # stderr, as it arrives
    reader: threading.Thread
    settled: threading.Event  # set once it serves or its stderr has ended (it exited)

    def serving(self) -> str | None:
        return next((line for line in self.lines if ": serving at " in line), None)

    def address(self) -> str:
        return self.serving().split(": serving at ")[1].split()[0]

    def finish(self, signum: int | None = None, pid: int | None = None) -> tuple[int, str]:
        """Its exit code and stdout, after `signum` (to `pid`, else to it) if given."""
        if signum is not None and self.process.poll() is None:
            os.kill(pid or self.process.pid, signum)
        out = self.process.stdout.read()
        code = self.process.wait(timeout=60)
        self.reader.join(timeout=10)
        return code, out

    def error(self) -> str:
        (line,) = [line for line in self.lines if ": error: " in line]
        return line


def launch(*argv: str, prefix=(), wait: bool = True) -> Program:
    """The program, once it serves or has exited (unless not `wait`); killed by the test's end."""
    process = subprocess.Popen([*prefix, *PROGRAM, *argv, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    lines: list[str] = []
    settled = threading.Event()

    def read():
        for line in process.stderr:
            lines.append(line)
            if ": serving at " in line:
                settled.set()
        settled.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    program = Program(process, lines, reader, settled)
    _LAUNCHED.append(program)
    # An event, not a poll: most of these programs refuse in a moment, and a poll's interval would be
    # most of each test's time. The bound is for a hung program: one that imports TensorFlow on a busy
    # machine can take a minute to serve.
    if wait and not settled.wait(180):
        pytest.fail("gave up waiting for the server to serve or refuse")
    return program


_LAUNCHED: list[Program] = []


@pytest.fixture(autouse=True)
def _kill_leftovers():
    yield
    while _LAUNCHED:
        process = _LAUNCHED.pop().process
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def peer():
    """A namespace standing for another host, routed through a veth pair to this machine."""
    with namespaces.namespace("peer") as ns:
        yield ns, namespaces.join(ns, "p")


def targets_of_the_peer(link: namespaces.Link, port: int) -> list[str]:
    """Every address of this machine a host on the link tries: the link's, IPv4, IPv6 and link-local,
    and those of its other interfaces (the peer's default route is the link)."""
    near = namespaces.addresses()
    link_local = next(address for name, address, scope in near if name == link.near and scope == "link")
    others = [address for name, address, scope in near if name != link.near and scope == "global"]
    hosts = [link.near_v4, link.near_v6, f"{link_local}%{link.far}", *others]
    return [f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host in hosts]


def targets_here(port: int) -> list[str]:
    hosts = ["127.0.0.1", "::1"] + [f"{a}%{name}" if scope == "link" else a for name, a, scope in namespaces.addresses()]
    return [f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host in hosts]


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_by_default_no_server_starts_where_another_host_reaches_it(role, peer):
    ns, link = peer
    port = free_port()
    toward = ["--dispatcher", f"127.0.0.1:{free_port()}"] if role == "worker" else []
    program = launch(role, "--port", str(port), *toward)  # --host 127.0.0.1 by default
    reached = {**namespaces.connects(targets_of_the_peer(link, port), ns), **namespaces.connects(targets_here(port))}
    code, _ = program.finish(signal.SIGKILL)
    assert not any(reached.values()), f"serving, and reached at {[t for t, ok in reached.items() if ok]}"
    assert code == 1 and not program.serving()
    error = program.error()
    assert error.startswith(f"stoke data-service {role}: error: interfaces besides loopback are up (")
    assert link.near in error  # the peer's link, up
    assert EXPOSED in error and "give --trusted-network where the network admits only the trainers and workers" in error


def _machine(kind: str) -> str:
    """One address of this machine besides loopback's, of `kind`."""
    for name, address, scope in namespaces.addresses():
        if kind == "IPv4" and "." in address and scope == "global":
            return address
        if kind == "IPv6" and ":" in address and scope == "global":
            return address
        if kind == "link-local" and scope == "link":
            return f"{address}%{name}"
    pytest.skip(f"this machine has no {kind} address but loopback's")


HOSTS = {  # what --host stands for -> how an attacker writes it
    "IPv4": lambda: _machine("IPv4"),
    "IPv6": lambda: _machine("IPv6"),
    "IPv6 in brackets": lambda: f"[{_machine('IPv6')}]",
    "link-local IPv6": lambda: _machine("link-local"),
    "IPv4-mapped IPv6": lambda: f"::ffff:{_machine('IPv4')}",
    "IPv4 as one number": lambda: str(int(ipaddress.ip_address(_machine("IPv4")))),
}


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
@pytest.mark.parametrize("kind", HOSTS)
def test_a_host_other_hosts_reach_is_refused_without_the_flag(kind, role):
    host = HOSTS[kind]()
    program = launch(role, "--host", host, "--port", "0", *_toward(role))
    assert program.finish(signal.SIGKILL)[0] == 1 and not program.serving()
    assert f"--host {host}" in program.error() and "is not loopback: there any peer could run TensorFlow ops" in program.error()


@pytest.mark.parametrize("trusted", [False, True], ids=["", "trusted-network"])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "0", "::ffff:0.0.0.0"])
def test_a_wildcard_host_is_refused_with_or_without_the_flag(host, trusted):
    for role in ("dispatcher", "worker"):
        program = launch(role, "--host", host, "--port", "0", *_toward(role), *(["--trusted-network"] if trusted else []))
        assert program.finish(signal.SIGKILL)[0] == 1 and not program.serving()
        assert f"--host {host}: a wildcard is no address to reach a server at" in program.error()


def _toward(role: str) -> list[str]:
    return ["--dispatcher", f"127.0.0.1:{free_port()}"] if role == "worker" else []


@pytest.fixture(scope="module")
def hosts_file(tmp_path_factory):
    """Runs a program with this machine's /etc/hosts plus names of its own, in a mount namespace."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("`unshare -m` is not permitted here: no private /etc/hosts to name an address")
    address = _machine("IPv4")
    path = tmp_path_factory.mktemp("etc") / "hosts"
    path.write_text(open("/etc/hosts").read() + f"\n{address} peerhost\n127.0.0.1 mixedhost\n{address} mixedhost\n")
    return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(path)]


@pytest.mark.parametrize("name", ["peerhost", "mixedhost"])  # the second stands for loopback too
def test_a_hostname_for_an_address_other_hosts_reach_is_refused(name, hosts_file):
    for role in ("dispatcher", "worker"):
        program = launch(role, "--host", name, "--port", "0", *_toward(role), prefix=hosts_file)
        assert program.finish(signal.SIGKILL)[0] == 1 and not program.serving()
        assert f"--host {name} ({_machine('IPv4')}) is not loopback" in program.error()


def test_with_the_flag_the_startup_line_says_it_serves_the_network_and_it_does(peer):
    ns, link = peer
    program = launch("dispatcher", "--host", link.near_v4, "--port", "0", "--trusted-network")
    port = int(program.address().rsplit(":", 1)[1])
    assert (f"serving at grpc://{link.near_v4}:{port} on every interface of this machine (--trusted-network): any "
            f"peer that reaches port {port} {EXPOSED}") in program.serving()
    reached = namespaces.connects(targets_of_the_peer(link, port), ns)
    assert all(reached.values()), reached  # every interface, IPv4 and IPv6, as the line says
    code, out = program.finish(signal.SIGTERM)
    assert code == 0 and json.loads(out.splitlines()[-1])["stopped"] is True


def test_alone_on_loopback_the_servers_run_and_stop_once_an_interface_comes_up():
    with namespaces.namespace("alone") as ns:
        prefix = namespaces.in_namespace(ns)
        dispatcher = launch("dispatcher", "--port", "0", prefix=prefix)
        assert "to this machine alone (no interface but loopback is up; one coming up stops it)" in dispatcher.serving()
        worker = launch("worker", "--dispatcher", dispatcher.address(), "--port", "0", prefix=prefix)
        ask = f"from components.train import data_service; print(data_service.workers({dispatcher.address()!r}))"
        assert worker.address() in namespaces.run(sys.executable, "-c", ask, ns=ns).stdout
        link = namespaces.join(ns, "a", index=1, route=False)
        for server in (dispatcher, worker):
            code, out = server.finish()  # each stops by itself
            assert code == 1 and f"error: stopped: interface {link.far} came up" in server.error(), server.lines
            assert "came up" in json.loads(out.splitlines()[-1])["error"]


def _as_init() -> list[str]:
    if not shutil.which("unshare") or subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode:
        pytest.skip("`unshare --pid` is not permitted here: the program cannot be PID 1 of a namespace")
    return ["unshare", "--pid", "--fork"]


def _inner(program: Program, as_init: bool) -> int:
    """The program's own process: under unshare, the child it started as PID 1 of the new namespace."""
    if not as_init:
        return program.process.pid
    pid = program.process.pid
    return int(wait_for(lambda: open(f"/proc/{pid}/task/{pid}/children").read().split(), "unshare's child", every=0.05)[0])


@pytest.mark.parametrize("as_init", [False, True], ids=["process", "pid-1"])
def test_a_sigterm_while_the_worker_starts_makes_it_leave_before_serving(as_init):
    prefix = _as_init() if as_init else []
    with socket.create_server(("127.0.0.1", 0)) as silent:  # a dispatcher that takes the call, never answers
        silent.settimeout(60)
        worker = launch("worker", "--dispatcher", f"127.0.0.1:{silent.getsockname()[1]}", "--port", "0",
                        "--trusted-network", prefix=prefix, wait=False)
        connection, _ = silent.accept()  # the worker is starting: it asks its dispatcher for the workers
        os.kill(_inner(worker, as_init), signal.SIGTERM)
        connection.close()
    code, out = worker.finish()
    assert code == 0, worker.lines
    assert json.loads(out.splitlines()[-1]) == {"role": "worker", "address": None, "stopped": True}
    assert not worker.serving()


def test_a_sigterm_stops_a_serving_dispatcher_that_is_pid_1():
    prefix = _as_init()
    dispatcher = launch("dispatcher", "--port", "0", "--trusted-network", prefix=prefix)
    assert dispatcher.serving(), dispatcher.lines
    code, out = dispatcher.finish(signal.SIGTERM, _inner(dispatcher, True))
    assert code == 0 and json.loads(out.splitlines()[-1])["stopped"] is True
    assert any(": stopped" in line for line in dispatcher.lines)
