"""A presigned manifest URL (`https://host/bucket/m.csv?X-Amz-Signature=...`, or a signature under any other
name) is read with its query, which no file under ROOT and no printed line holds; its relative rows are
files beside it, named without the query (a signature signs one file), and a row signed on its own
(`a.jpg?hmac=...`) is read with its query and named without it too. A web server on 127.0.0.1 that serves
the manifest, and the files named signed-*, to their signatures only."""
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
HMAC = f"hmac={TOKEN}&exp=9"  # a signature under a name no list of credential names holds
# Rows signed on their own, as imgix, Akamai, a CDN's HMAC or a signed URL inside another sign them; each a
# file of its own (signed-*), read only with its signature (the server wants TOKEN in the query).
SIGNED_ROWS = [f"cat/signed-c.jpg?hmac={TOKEN}c", f"cat/signed-d.jpg?s={TOKEN}d",
               f"cat/signed-e.jpg?hdnts=exp=9~acl=*~hmac={TOKEN}e",
               f"cat/signed-f.jpg?url=https%3A%2F%2Fb.s3.amazonaws.com%2Fk%3FX-Amz-Signature%3D{TOKEN}f",
               f"cat/g.jpg#access_token={TOKEN}g"]


class _Signed(http.server.SimpleHTTPRequestHandler):
    """Serves its folder; a manifest (m.*) only to a request that carries the signature, signed-* files only
    to one whose query holds TOKEN."""

    def do_GET(self):
        if self._signed():
            super().do_GET()

    def do_HEAD(self):  # S3 refuses a HEAD with a GET's signature: fsspec falls back to a GET
        if "/m." in self.path:
            return self._refuse()
        if self._signed():
            super().do_HEAD()

    def _signed(self) -> bool:
        path, _, query = self.path.partition("?")
        if "/m." in path and query not in (QUERY, HMAC) or "/signed-" in path and TOKEN not in query:
            self._refuse()
            return False
        return True

    def _refuse(self):
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def write_manifest(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) if path.suffix == ".jsonl"
                    else "uri,label\n" + "".join(f"{r['uri']},{r.get('label', '')}\n" for r in rows))


@pytest.mark.parametrize("manifest, query", [("m.csv", QUERY), ("m.jsonl", HMAC)])
def test_a_presigned_manifest_is_read_with_its_query_and_named_without_it(manifest, query, tmp_path, capsys):
    bucket = tmp_path / "site" / "bucket"
    (bucket / "cat").mkdir(parents=True)
    names = ["a.jpg", "b.jpg", "signed-c.jpg", "signed-d.jpg", "signed-e.jpg", "signed-f.jpg", "g.jpg", "signed-h.jpg"]
    for seed, name in enumerate(names):
        (bucket / "cat" / name).write_bytes(images.rgb_jpeg(seed + 1))
    rows = [{"uri": "cat/a.jpg", "label": "cat"}, {"uri": "./x/../cat/b.jpg", "label": "cat"},
            {"uri": "missing.jpg", "label": "cat"}, {"uri": "cat/no-label.jpg"},
            *({"uri": row, "label": "cat"} for row in SIGNED_ROWS),
            {"uri": "cat/signed-c.jpg?hmac=OTHER", "label": "cat"},  # the same file, listed twice: read once
            {"uri": "cat/signed-h.jpg?sig=EXPIRED", "label": "cat"}]  # a signature the server refuses
    write_manifest(bucket / manifest, rows)
    root = tmp_path / "root"
    with web_server(_Signed, tmp_path / "site") as port:
        site = f"http://127.0.0.1:{port}/bucket"
        code, summary = ingest(f"{site}/{manifest}?{query}", root, *IN_MEMORY, "--max-bad-fraction", "0.9",
                               "--near-copies", "report", capsys=capsys)
        assert code == 0 and summary["published"], summary
        # Signed again (a presigned manifest is, each night): its files are the ones already published.
        write_manifest(bucket / manifest, [{**row, "uri": row["uri"].replace(TOKEN, TOKEN + "2")} for row in rows])
        code, again = ingest(f"{site}/{manifest}?{query}", root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and not again["published"] and "nothing new" in again["message"], again
    published = json.load(open(f"{Root(str(root)).span(1)}/{MANIFEST}"))
    assert sorted(r[SOURCE] for r in records(root, published)) == sorted(f"{site}/cat/{name}" for name in names[:-1])
    assert {d["uri"]: d["reason"] for d in dead_letters(root, 1)} == {
        f"{site}/missing.jpg": "not found: the server answered HTTP 404 File not found",
        f"{site}/cat/no-label.jpg": "manifest row has no label",
        f"{site}/cat/signed-h.jpg": "refused: the server answered HTTP 403 Forbidden"}
    assert published["source"] == f"{site}/{manifest}"
    assert sorted(s["uri"] for s in published["sources"]) == sorted(
        [f"{site}/cat/{name}" for name in names] + [f"{site}/missing.jpg", f"{site}/cat/no-label.jpg"])
    printed = capsys.readouterr()
    assert holding(str(root)) == [] and not shows(printed.out + printed.err)


def test_preflight_takes_a_presigned_manifest_for_a_manifest(tmp_path):
    from components.preflight.source import source_check

    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "m.csv").write_text("uri,label\ncat/a.jpg,cat\n")
    with web_server(_Signed, tmp_path) as port:
        check = source_check(f"http://127.0.0.1:{port}/bucket/m.csv?{QUERY}")
    assert check.status == "ok" and check.facts["kind"] == "manifest", check


@pytest.mark.parametrize("query", [QUERY, HMAC])
def test_a_manifest_url_whose_signature_the_server_refuses_says_so_in_one_line(query, tmp_path, capsys):
    """An expired or wrong signature is a refusal, not a manifest that "does not exist"."""
    from components.preflight.source import source_check

    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "m.csv").write_text("uri,label\ncat/a.jpg,cat\n")
    with web_server(_Signed, tmp_path) as port:
        source = f"http://127.0.0.1:{port}/bucket/m.csv?{query.replace(TOKEN, 'EXPIRED')}"
        code, _ = ingest(source, tmp_path / "root", capsys=None)
        check = source_check(source)
    printed = capsys.readouterr()
    (line,) = printed.err.strip().splitlines()
    assert line.startswith(f"stoke ingest: error: source http://127.0.0.1:{port}/bucket/m.csv?*** was refused"), line
    assert code == 1 and "was refused: the server answered HTTP 403 Forbidden: give SOURCE the credentials" in line
    assert "EXPIRED" not in printed.out + printed.err
    assert check.status == "fail" and "was refused: the server answered HTTP 403 Forbidden" in check.summary
