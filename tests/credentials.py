"""For tests of credentials in SOURCE: a password that holds what breaks naive scrubbers, a web server on
127.0.0.1 that asks for it (basic auth) and serves a folder, and a search of every byte under a folder
for it, gzip members (TFRecord shards, indexes) opened."""
from __future__ import annotations

import base64
import gzip
import http.server
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from tests.waiting import web_server

USER = "alice"
TOKEN = "S3CRETPASS"  # what every search looks for: any spelling of the password holds it
# As written in SOURCE: digits first, as a port would start, then `;`, quotes, a space, unencoded @ and :, a
# percent-encoded @.
PASSWORD = f"2024;pa\"s's {TOKEN}@:%40x"
DECODED = PASSWORD.replace("%40", "@")  # what the server is sent (aiohttp decodes the user info)
# A header that was logged would hold the password only as base64.
NEEDLES = (TOKEN.encode(), base64.b64encode(f"{USER}:{DECODED}".encode()))


def basic_auth_server(folder: str) -> AbstractContextManager[int]:
    """Serves `folder` on 127.0.0.1 (the port is yielded) to requests that send USER:DECODED; 401 to others."""
    expected = "Basic " + base64.b64encode(f"{USER}:{DECODED}".encode()).decode()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_HEAD(self):
            if self._allowed():
                super().do_HEAD()

        def do_GET(self):
            if self._allowed():
                super().do_GET()

        def _allowed(self) -> bool:
            if self.headers.get("Authorization") == expected:
                return True
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="photos"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False

        def log_message(self, *args):
            pass

    return web_server(Handler, folder)


def holding(folder: str) -> list[str]:
    """Every file under `folder` (recursively, links not followed) whose bytes, or whose gzip members'
    bytes, hold the password."""
    found = []
    for base, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(base, name)
            if not os.path.islink(path) and os.path.isfile(path) and shows(_contents(path)):
                found.append(os.path.relpath(path, folder))
    return sorted(found)


def shows(data: bytes | str) -> bool:
    """Whether `data` (printed text, a file's bytes) holds the password."""
    data = data.encode() if isinstance(data, str) else data
    return any(needle in data for needle in NEEDLES)


@contextmanager
def command_lines() -> Iterator[set[bytes]]:
    """The command lines of this machine's processes, as `ps` shows them to every local user, seen while the
    block runs: sampled from /proc every 50 ms."""
    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        seen.add(f.read().replace(b"\0", b" "))
                except OSError:  # ended meanwhile
                    pass
            done.wait(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def _contents(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":  # gzip: TFRecord shards, the indexes (concatenated members too)
        try:
            data += gzip.decompress(data)
        except (OSError, EOFError):
            pass
    return data
