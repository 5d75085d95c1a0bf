"""One file that its store refuses for good is a dead letter with the reason, not a failed run: a web server's
401, 403, 404 or 410 (also after a redirect, whose URL is named without its credentials), when the file is
listed or only when it is read; a bucket's missing key, missing bucket or AccessDenied. A server that is busy
(5xx, 429) fails the run as transient (exit 75), to be retried. Real servers on 127.0.0.1 (moto, the GCS
emulator, a web server)."""
from __future__ import annotations

import http.server
import json
import re
import urllib.request
from contextlib import contextmanager

import boto3
import fsspec
import pytest

from components.common.program import TRANSIENT
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest
from tests.credentials import PASSWORD, TOKEN, USER, holding, shows
from tests.waiting import web_server

LENIENT = ["--max-bad-fraction", "0.9", "--near-copies", "report"]
GOOD = ["cat/a.jpg", "cat/b.jpg"]


class _Answering(http.server.SimpleHTTPRequestHandler):
    """Serves its folder; `/answer/HEAD/GET/path` answers HEAD and GET with those statuses (200: the file at
    path), and `/moved/...` redirects to a missing file through a URL that holds a signature."""

    def do_HEAD(self):
        self._answer("HEAD")

    def do_GET(self):
        self._answer("GET")

    def _answer(self, method: str):
        if self.path.startswith("/moved/"):
            return self._send(302, Location=f"/answer/404/404/gone.jpg?X-Amz-Signature={TOKEN}")
        found = re.match(r"/answer/(\d{3})/(\d{3})(/.*)", self.path)
        status = int(found[1 if method == "HEAD" else 2]) if found else 200
        if status != 200:
            return self._send(status)
        self.path = found[3] if found else self.path
        super().do_HEAD() if method == "HEAD" else super().do_GET()

    def _send(self, status: int, **headers):
        self.send_response(status)
        for name, value in {"Content-Length": "0", **headers}.items():
            self.send_header(name, value)
        self.end_headers()

    def log_message(self, *args):
        pass


def site(tmp_path, rows: list[str]):
    """Two good images and m.csv naming them and `rows`, under tmp_path/site."""
    folder = tmp_path / "site"
    (folder / "cat").mkdir(parents=True)
    for seed, name in enumerate(GOOD):
        (folder / name).write_bytes(images.rgb_jpeg(seed + 1))
    (folder / "m.csv").write_text("uri,label\n" + "".join(f"{row},cat\n" for row in [*GOOD, *rows]))
    return folder


def reasons(root) -> dict[str, str]:
    return {letter["uri"].rsplit(":", 1)[-1].split("/", 1)[-1]: letter["reason"] for letter in dead_letters(root, 1)}


def test_files_a_web_server_refuses_are_dead_letters_with_its_answer(tmp_path, capsys):
    refused = {"answer/401/401/x.jpg": "refused: the server answered HTTP 401 Unauthorized",
               "answer/403/403/x.jpg": "refused: the server answered HTTP 403 Forbidden",
               "answer/404/404/x.jpg": "not found: the server answered HTTP 404 Not Found",
               "answer/410/410/x.jpg": "not found: the server answered HTTP 410 Gone",
               # listed, then refused when it is read
               "answer/200/403/cat/a.jpg": "refused: the server answered HTTP 403 Forbidden",
               "answer/200/404/cat/b.jpg": "not found: the server answered HTTP 404 Not Found"}
    folder, root = site(tmp_path, [*refused, "moved/x.jpg"]), tmp_path / "root"
    with web_server(_Answering, folder) as port:
        source = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/m.csv"
        code, summary = ingest(source, root, *IN_MEMORY, *LENIENT, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == len(GOOD), summary
    found = reasons(root)
    moved = found.pop("moved/x.jpg")
    assert found == refused
    assert moved == ("not found: the server answered HTTP 404 Not Found, redirected to "
                     f"http://127.0.0.1:{port}/answer/404/404/gone.jpg")  # without the signature it carried
    printed = capsys.readouterr()
    assert holding(str(root)) == [] and not shows(printed.out + printed.err)


@pytest.mark.parametrize("row", ["answer/503/503/x.jpg", "answer/429/429/x.jpg", "answer/200/503/cat/a.jpg"])
def test_a_file_a_web_server_is_too_busy_to_serve_fails_the_run_as_transient(row, tmp_path, capsys):
    folder, root = site(tmp_path, [row]), tmp_path / "root"
    with web_server(_Answering, folder) as port:
        code = ingest(f"http://127.0.0.1:{port}/m.csv", root, *IN_MEMORY, *LENIENT)[0]
    printed = capsys.readouterr()
    assert code == TRANSIENT and "Traceback" not in printed.err, printed.err
    assert not (root / "data" / "spans" / "span-00001").exists()


@contextmanager
def moto_iam(endpoint: str):
    """moto checks every request's credentials and permissions in the block (its IAM), as AWS does."""
    def auth(count: bytes) -> None:
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", count, {"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).close()

    auth(b"0")
    try:
        yield
    finally:
        auth(b"inf")


def test_bucket_files_that_are_missing_or_denied_are_dead_letters(s3_endpoint, s3_bucket, tmp_path, capsys,
                                                                  monkeypatch):
    s3, iam = (boto3.client(name, endpoint_url=s3_endpoint) for name in ("s3", "iam"))
    s3.create_bucket(Bucket=f"{s3_bucket}-other")
    s3.put_object(Bucket=f"{s3_bucket}-other", Key="x.jpg", Body=images.rgb_jpeg(3))
    for seed, name in enumerate(GOOD):
        s3.put_object(Bucket=s3_bucket, Key=f"m/{name}", Body=images.rgb_jpeg(seed + 1))
    rows = ["cat/missing.jpg", f"s3://{s3_bucket}-other/x.jpg", "s3://no-such-bucket-stoke/x.jpg"]
    s3.put_object(Bucket=s3_bucket, Key="m/m.csv", Body="uri,label\n" + "".join(f"{r},cat\n" for r in [*GOOD, *rows]))
    # A user who may read the manifest's bucket only.
    iam.create_user(UserName="one-bucket")
    iam.put_user_policy(UserName="one-bucket", PolicyName="one-bucket", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": [
            f"arn:aws:s3:::{s3_bucket}", f"arn:aws:s3:::{s3_bucket}/*"]}]}))
    key = iam.create_access_key(UserName="one-bucket")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    fsspec.filesystem("s3").clear_instance_cache()  # one made with the other credentials would be reused
    root = tmp_path / "root"
    with moto_iam(s3_endpoint):
        code, summary = ingest(f"s3://{s3_bucket}/m/m.csv", root, *IN_MEMORY, *LENIENT, "--allow-outside-source",
                               capsys=capsys)
    fsspec.filesystem("s3").clear_instance_cache()
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == len(GOOD), summary
    assert {letter["uri"]: letter["reason"] for letter in dead_letters(root, 1)} == {
        f"s3://{s3_bucket}/m/cat/missing.jpg": "not found",
        f"s3://{s3_bucket}-other/x.jpg": "access denied (AccessDenied: Access Denied)",
        # as AWS answers it: a user may not learn whether a bucket it may not read exists
        "s3://no-such-bucket-stoke/x.jpg": "access denied (AccessDenied: Access Denied)"}


def test_gcs_files_that_are_missing_are_dead_letters(gcs_endpoint, tmp_path, capsys):
    fs = fsspec.filesystem("gs")
    prefix = f"stoke-gcs/{tmp_path.name}"
    for seed, name in enumerate(GOOD):
        fs.pipe_file(f"{prefix}/{name}", images.rgb_jpeg(seed + 1))
    rows = ["cat/missing.jpg", "gs://no-such-bucket-stoke/x.jpg"]
    fs.pipe_file(f"{prefix}/m.csv", ("uri,label\n" + "".join(f"{r},cat\n" for r in [*GOOD, *rows])).encode())
    root = tmp_path / "root"
    code, summary = ingest(f"gs://{prefix}/m.csv", root, *IN_MEMORY, *LENIENT, "--allow-outside-source", capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == len(GOOD), summary
    assert {letter["uri"]: letter["reason"] for letter in dead_letters(root, 1)} == {
        f"gs://{prefix}/cat/missing.jpg": "not found", "gs://no-such-bucket-stoke/x.jpg": "not found"}
