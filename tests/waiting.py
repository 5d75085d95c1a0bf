"""For tests that start servers and processes: free loopback ports, a web server on one, and one way to wait for
them."""
import functools
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago (all bound at once, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


@contextmanager
def web_server(handler, folder=None) -> Iterator[int]:
    """A web server on 127.0.0.1 answering with `handler` (given `folder`, a SimpleHTTPRequestHandler serving
    it) on a thread of its own; yields its port. Shut down, closed and joined on the way out, passed or failed."""
    if folder is not None:
        handler = functools.partial(handler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # shutdown() waits for the serving loop's next look at its flag: every 0.05 s, not the default 0.5 s.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def listening(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(probe, what: str, seconds: float = 60, every: float = 0.5, process=None):
    """The first truthy value `probe()` returns, polling every `every` seconds; fails the test after
    `seconds`, or as soon as `process` (a Popen the probe depends on) has exited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            pytest.fail(f"the process exited with code {process.returncode} while waiting for {what}")
        value = probe()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"gave up waiting for {what}")


def first_line(process, what: str, seconds: float = 120) -> str:
    """The first line `process` prints (stripped), read from its stdout pipe; a process that prints
    nothing within `seconds` is killed and fails the test, instead of holding the run until CI's limit."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    if reader.is_alive():
        process.kill()  # its pipe closes: the reader ends too
        pytest.fail(f"gave up waiting for {what}: nothing printed within {seconds} s")
    return line[0].strip()
