"""A presigned manifest URL (`https://host/bucket/m.csv?X-Amz-Signature=...`) is read with its query, which
no file under ROOT and no printed line holds; its relative rows are files beside it, named without the
query (a signature signs one file). A web server on 127.0.0.1 that serves the manifest to its signature only."""
from __future__ import annotations

import http.server
import json

import pytest

from components.contracts.layout import MANIFEST, Root
from components.contracts.schema import SOURCE
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest, records
from tests.credentials import TOKEN, holding, shows
from tests.waiting import web_server

# As S3 presigns a GET; the credential spelled with its slashes unencoded, as a hand-pasted URL may hold it.
QUERY = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE/20260101/us-east-1/s3/aws4_request"
         f"&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={TOKEN}")


class _Signed(http.server.SimpleHTTPRequestHandler):
    """Serves its folder; a manifest (m.*) only to a request that carries the signature."""

    def do_GET(self):
        if self._signed():
            super().do_GET()

    def do_HEAD(self):  # S3 refuses a HEAD with a GET's signature: fsspec falls back to a GET
        if "/m." in self.path:
            return self._refuse()
        super().do_HEAD()

    def _signed(self) -> bool:
        if "/m." not in self.path or self.path.endswith(f"?{QUERY}"):
            return True
        self._refuse()
        return False

    def _refuse(self):
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("manifest", ["m.csv", "m.jsonl"])
def test_a_presigned_manifest_is_read_with_its_query_and_named_without_it(manifest, tmp_path, capsys):
    bucket = tmp_path / "site" / "bucket"
    (bucket / "cat").mkdir(parents=True)
    for seed, name in enumerate(["a.jpg", "b.jpg"]):
        (bucket / "cat" / name).write_bytes(images.rgb_jpeg(seed + 1))
    rows = [{"uri": "cat/a.jpg", "label": "cat"}, {"uri": "./x/../cat/b.jpg", "label": "cat"},
            {"uri": "missing.jpg", "label": "cat"}, {"uri": "cat/no-label.jpg"}]
    (bucket / manifest).write_text("".join(json.dumps(row) + "\n" for row in rows) if manifest.endswith(".jsonl")
                                   else "uri,label\n" + "".join(f"{r['uri']},{r.get('label', '')}\n" for r in rows))
    root = tmp_path / "root"
    with web_server(_Signed, tmp_path / "site") as port:
        site = f"http://127.0.0.1:{port}/bucket"
        code, summary = ingest(f"{site}/{manifest}?{QUERY}", root, *IN_MEMORY, "--max-bad-fraction", "0.9",
                               "--near-copies", "report", capsys=capsys)
    assert code == 0 and summary["published"], summary
    published = json.load(open(f"{Root(str(root)).span(1)}/{MANIFEST}"))
    assert sorted(r[SOURCE] for r in records(root, published)) == [f"{site}/cat/a.jpg", f"{site}/cat/b.jpg"]
    assert {d["uri"]: d["reason"] for d in dead_letters(root, 1)} == {
        f"{site}/missing.jpg": "not found: the server answered HTTP 404 File not found",
        f"{site}/cat/no-label.jpg": "manifest row has no label"}
    assert published["source"].startswith(f"{site}/{manifest}?") and "X-Amz-Signature=***" in published["source"]
    printed = capsys.readouterr()
    assert holding(str(root)) == [] and not shows(printed.out + printed.err)


def test_preflight_takes_a_presigned_manifest_for_a_manifest(tmp_path):
    from components.preflight.source import source_check

    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "m.csv").write_text("uri,label\ncat/a.jpg,cat\n")
    with web_server(_Signed, tmp_path) as port:
        check = source_check(f"http://127.0.0.1:{port}/bucket/m.csv?{QUERY}")
    assert check.status == "ok" and check.facts["kind"] == "manifest", check


def test_a_manifest_url_whose_signature_the_server_refuses_says_so_in_one_line(tmp_path, capsys):
    """An expired or wrong signature is a refusal, not a manifest that "does not exist"."""
    from components.preflight.source import source_check

    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "m.csv").write_text("uri,label\ncat/a.jpg,cat\n")
    with web_server(_Signed, tmp_path) as port:
        source = f"http://127.0.0.1:{port}/bucket/m.csv?{QUERY.replace(TOKEN, 'EXPIRED')}"
        code, _ = ingest(source, tmp_path / "root", capsys=None)
        check = source_check(source)
    printed = capsys.readouterr()
    (line,) = printed.err.strip().splitlines()
    assert code == 1 and line.startswith(f"stoke ingest: error: source http://127.0.0.1:{port}/bucket/m.csv?"), line
    assert "was refused: the server answered HTTP 403 Forbidden: give SOURCE the credentials" in line
    assert "X-Amz-Signature=***" in line and "EXPIRED" not in printed.out + printed.err
    assert check.status == "fail" and "was refused: the server answered HTTP 403 Forbidden" in check.summary
