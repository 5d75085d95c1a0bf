"""A web server SOURCE that is away (the connection refused or reset) or busy (5xx) is transient, exit 75, in
one line naming its host, from ingest and from preflight's SOURCE check; one that answers 404 is a SOURCE
that does not exist, as before, with no bucket to name. An S3 endpoint that refuses is transient too, for
SOURCE and ROOT. Real servers on 127.0.0.1."""
from __future__ import annotations

import http.server
import json
import os
import socket
import struct
import threading

import pytest

from beam_jobs.ingest import run
from components.common.program import TRANSIENT
from components.preflight.source import source_check
from tests.waiting import free_port, web_server


class _Answers(http.server.BaseHTTPRequestHandler):
    status = 404

    def do_HEAD(self):
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args):
        pass


@pytest.fixture
def answering(request):
    """A server on 127.0.0.1 answering every request with the parametrized status; its port."""
    handler = type("Handler", (_Answers,), {"status": request.param})
    with web_server(handler) as port:
        yield port


@pytest.fixture
def resetting():
    """A server on 127.0.0.1 that accepts each connection and resets it (RST) before answering; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()


def ingest_line(source: str, tmp_path, capsys) -> tuple[int, str]:
    code = run([source, "--root", str(tmp_path / "root"), "--json"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, json.loads(captured.out.strip().splitlines()[-1])["error"]


@pytest.mark.parametrize("path", ["m.csv", "photos/"])
def test_a_web_server_that_refuses_the_connection_is_transient(path, tmp_path, capsys):
    port = free_port()
    source = f"http://127.0.0.1:{port}/{path}"
    code, error = ingest_line(source, tmp_path, capsys)
    assert code == TRANSIENT and error.startswith(f"cannot reach host 127.0.0.1:{port} ("), error
    assert error.endswith("check the network and that the server is up") and "bucket" not in error
    check = source_check(source)
    assert check.status == "fail" and check.facts["transient"] and check.summary.startswith(
        f"cannot reach host 127.0.0.1:{port} (")


def test_a_web_server_that_resets_the_connection_is_transient(resetting, tmp_path, capsys):
    source = f"http://127.0.0.1:{resetting}/m.csv"
    code, error = ingest_line(source, tmp_path, capsys)
    assert code == TRANSIENT and error.startswith(f"cannot reach host 127.0.0.1:{resetting} ("), error
    assert source_check(source).facts["transient"]


@pytest.mark.parametrize("answering", [503, 429], indirect=True)
def test_a_busy_web_server_is_transient(answering, tmp_path, capsys):
    code, error = ingest_line(f"http://127.0.0.1:{answering}/m.csv", tmp_path, capsys)
    assert code == TRANSIENT and error.startswith(f"host 127.0.0.1:{answering} is busy or unavailable (HTTP "), error


@pytest.mark.parametrize("answering", [404], indirect=True)
def test_a_web_server_that_has_no_such_file_says_so_and_names_no_bucket(answering, tmp_path, capsys):
    source = f"http://127.0.0.1:{answering}/m.csv"
    code, error = ingest_line(source, tmp_path, capsys)
    assert code == 1 and error == f"source {source} does not exist"
    check = source_check(source)
    assert check.summary == f"{source} does not exist" and not check.facts["transient"]


@pytest.mark.parametrize("where", ["SOURCE", "ROOT"])
def test_an_s3_endpoint_that_refuses_the_connection_is_transient_too(where, tmp_path):
    import subprocess
    import sys

    port = free_port()
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    source, root = ("s3://photos/in", str(tmp_path / "root")) if where == "SOURCE" else (
        str(tmp_path / "photos"), "s3://stoke/root")
    # One attempt: botocore's retries back off for seconds between refusals, and the last refusal is
    # the same error, so the classification under test is unchanged.
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s", "AWS_MAX_ATTEMPTS": "1"}
    done = subprocess.run([sys.executable, "-m", "beam_jobs.ingest", source, "--root", root, "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    bucket = "photos" if where == "SOURCE" else "stoke"
    assert done.returncode == TRANSIENT and error.startswith(f"cannot reach S3 for bucket {bucket} ("), error
