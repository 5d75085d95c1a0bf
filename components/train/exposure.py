"""Who can reach a server of this machine that listens on every interface, as tf.data service's
servers do: TensorFlow 2.21 has them listen on "0.0.0.0:PORT", which gRPC widens to [::]:PORT (IPv4
and IPv6, every address of every interface), and neither its configs nor gRPC's environment take
another bind address. So such a server is for this machine alone exactly when no interface but
loopback is up, and its --host says only where it is reached, not where it listens.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import socket
import struct

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
