"""`stoke predict` against servers that answer something other than TF Serving's predict format:
one error line and a JSON line, never a traceback, and never more than a bounded answer read."""
from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from components.push import predict
from tests.components.conftest import tiny_image
from tests.waiting import web_server

HTML = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


class OddServer(http.server.BaseHTTPRequestHandler):
    """Answers by the first path segment: /garbage, /html, /huge, /list, /rows, /html-error."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        kind = self.path.split("/")[1]
        if kind == "drip":  # one byte at a time, each well within the timeout, never the whole answer
            self._head(200, "application/json", 1000)
            try:
                for _ in range(1000):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            return
        if kind == "huge":  # claims and streams far more than any predict answer
            self._head(200, "application/json", 1 << 30)
            chunk = b"[" * (1 << 20)
            try:
                for _ in range(1 << 10):
                    self.wfile.write(chunk)
            except OSError:
                pass  # the client stopped reading, as it should
            return
        status, kind_type, body = {
            "garbage": (200, "application/json", b"\x00\xff{not json at all"),
            "html": (200, "text/html", HTML),
            "html-error": (502, "text/html", HTML),
            "list": (200, "application/json", b"[1, 2, 3]"),
            "deep": (200, "application/json", b"[" * 50_000 + b"]" * 50_000),
            "deep-object": (200, "application/json", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
            "rows": (200, "application/json", json.dumps({"predictions": [{"probabilities": "high"}]}).encode()),
        }[kind]
        self._head(status, kind_type, len(body))
        self.wfile.write(body)

    def _head(self, status, content_type, length):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def odd_server():
    with web_server(OddServer) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "red.jpg"
    path.write_bytes(tiny_image(0, 1))
    return str(path)


def _error_line(capsys, argv: list[str]) -> tuple[str, str]:
    assert predict.run([*argv, "--json"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1
    return json.loads(captured.out.strip().splitlines()[-1])["error"], captured.err


@pytest.mark.parametrize("kind, words", [
    ("garbage", "not JSON"),
    ("html", "not JSON (text/html)"),
    ("html-error", "answered 502"),
    ("list", "without one prediction per image"),
    ("deep", "not JSON"),
    ("deep-object", "not JSON"),
    ("rows", "unexpected form"),
    ("huge", "larger than"),
])
def test_unexpected_answers_are_one_error_line(odd_server, image, capsys, kind, words):
    error, _ = _error_line(capsys, [f"{odd_server}/{kind}/v1/models/stoke", image])
    assert words in error and len(error) < 600


def test_a_server_that_does_not_speak_http(image, capsys):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"\x16\x03\x01 SSH-2.0-OpenSSH garbage\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        error, _ = _error_line(capsys, [f"http://127.0.0.1:{listener.getsockname()[1]}/v1/models/stoke", image])
    finally:
        listener.close()
    assert "not an HTTP answer" in error


def test_a_dripping_server_cannot_outlast_the_deadline(odd_server, image):
    from components.common.serving import PredictError, rest_predict

    started = time.monotonic()
    with pytest.raises(PredictError, match="did not answer within 1 s"):
        rest_predict(f"{odd_server}/drip/v1/models/stoke", [b"x"], timeout=1.0)
    assert time.monotonic() - started < 3


def test_a_silent_server_is_a_timeout_line(image, capsys):
    with socket.socket() as silent:  # accepts (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        from components.common import serving
        with pytest.raises(serving.PredictError, match="did not answer within 0.5 s"):
            serving.rest_predict(f"http://127.0.0.1:{silent.getsockname()[1]}/v1/models/stoke", [b"x"], timeout=0.5)
