"""Network namespaces for tests of who reaches a server: a peer namespace joined to this machine by a
veth pair stands for another host on a link of it, and a namespace with loopback alone for a machine
without a network. Made with `ip netns` (root); a test skips, saying why, where that is not permitted."""
from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import shutil
import subprocess
import sys

import pytest

# Tries a TCP connection to each HOST:PORT argument; prints one line per target: 1 if it connected.
_PROBE = """import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    family, _, _, _, address = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        print(1 if s.connect_ex(address) == 0 else 0)
"""


def run(*argv: str, ns: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(in_namespace(ns, *argv), capture_output=True, text=True, timeout=60)


def in_namespace(ns: str | None, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)


def must(*argv: str, ns: str | None = None) -> None:
    done = run(*argv, ns=ns)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"


@contextlib.contextmanager
def namespace(tag: str):
    """A new network namespace whose only interface is loopback, up."""
    name = f"stoke-{tag}-{os.getpid()}"
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot make a network namespace to connect from")
    made = run("ip", "netns", "add", name)
    if made.returncode:
        pytest.skip(f"`ip netns add` is not permitted here ({made.stderr.strip()}): no second network namespace")
    try:
        must("ip", "link", "set", "lo", "up", ns=name)
        yield name
    finally:
        run("ip", "netns", "del", name)  # takes the veth ends inside it, and so their pairs, along


@dataclasses.dataclass
class Link:
    """A veth pair: `near` in this namespace, `far` in another, addressed over IPv4 and IPv6."""
    near: str
    far: str
    near_v4: str
    far_v4: str
    near_v6: str
    far_v6: str


def join(ns: str, tag: str, index: int = 0, route: bool = True) -> Link:
    """A veth pair from this namespace into `ns`, both ends up; with `route`, `ns` sends everything
    through it, so that it reaches every address of this machine, as a host on its network would."""
    pid = os.getpid()
    subnet = (10 << 24) | ((pid * 4 + index) % (1 << 22)) << 2  # a /30 of 10/8 no other test run holds
    link = Link(f"stk{tag}{pid % 100000}h", f"stk{tag}{pid % 100000}f", str(ipaddress.ip_address(subnet + 1)),
                str(ipaddress.ip_address(subnet + 2)), f"fd5b:{pid >> 16:x}:{pid & 0xffff:x}:{index}::1",
                f"fd5b:{pid >> 16:x}:{pid & 0xffff:x}:{index}::2")
    must("ip", "link", "add", link.near, "type", "veth", "peer", "name", link.far)
    must("ip", "link", "set", link.far, "netns", ns)
    for side, name, v4, v6 in ((None, link.near, link.near_v4, link.near_v6), (ns, link.far, link.far_v4, link.far_v6)):
        must("ip", "addr", "add", f"{v4}/30", "dev", name, ns=side)
        must("ip", "addr", "add", f"{v6}/64", "dev", name, "nodad", ns=side)
        must("ip", "link", "set", name, "up", ns=side)
    if route:
        must("ip", "route", "add", "default", "via", link.near_v4, ns=ns)
        must("ip", "-6", "route", "add", "default", "via", link.near_v6, ns=ns)
    return link


def addresses(ns: str | None = None) -> list[tuple[str, str, str]]:
    """(interface, address, scope) of every address in a namespace but loopback's."""
    found = []
    for line in run("ip", "-o", "addr", "show", ns=ns).stdout.splitlines():
        fields = line.split()
        if fields[1] != "lo" and fields[2] in ("inet", "inet6"):
            found.append((fields[1].split("@")[0], fields[3].split("/")[0], fields[fields.index("scope") + 1]))
    return found


def connects(targets: list[str], ns: str | None = None) -> dict[str, bool]:
    """Which of `targets` (HOST:PORT, a link-local HOST with its %interface) accept a TCP connection
    from namespace `ns`."""
    done = run(sys.executable, "-c", _PROBE, *targets, ns=ns)
    assert done.returncode == 0, done.stderr
    return dict(zip(targets, (line == "1" for line in done.stdout.split())))
