"""A SOURCE behind a password (a web server on 127.0.0.1 with basic auth): ingest reads its manifest and
images with the password and names every file without it, in the records themselves, the indexes,
the dead letters and the manifest; a row's own query is read with and never named, and a row whose name
holds a credential of its own is refused unread."""
from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

from beam_jobs.source_names import CREDENTIAL_IN_NAME
from components.contracts import schema
from components.contracts.layout import CONTENT_INDEX, DEAD_LETTER, MANIFEST, Root
from components.contracts.secrets import SOURCE_ENV
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest, records
from tests.credentials import PASSWORD, TOKEN, USER, basic_auth_server, holding, shows

LENIENT = ["--max-bad-fraction", "0.9"]  # the missing file and the refused rows are dead letters, not a failure


@pytest.fixture
def site(tmp_path):
    """photos/manifest.csv naming images by relative paths (one with an @ in its name) and one missing."""
    photos = tmp_path / "site" / "photos"
    names = {"cat/a.jpg": images.rgb_jpeg(1), "cat/b@2x.jpg": images.rgb_jpeg(2), "dog/c.png": images.rgb_png(3),
             "dog/d e.jpg": images.rgb_jpeg(4)}
    for name, data in names.items():
        (photos / name).parent.mkdir(parents=True, exist_ok=True)
        (photos / name).write_bytes(data)
    rows = [f"{name},{name.split('/')[0]}" for name in names] + ["dog/missing.jpg,dog"]
    (photos / "manifest.csv").write_text("uri,label\n" + "\n".join(rows) + "\n")
    return str(tmp_path / "site")


def test_files_behind_a_password_are_read_with_it_and_named_without_it(site, tmp_path, capsys):
    root = tmp_path / "root"
    with basic_auth_server(site) as port:
        named = f"http://{USER}:***@127.0.0.1:{port}/photos"
        source = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/photos/manifest.csv"
        code, summary = ingest(source, root, *IN_MEMORY, *LENIENT, capsys=capsys)
        assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 4, summary
        manifest = json.load(open(Root(str(root)).manifest(1)))
        assert manifest["source"] == f"{named}/manifest.csv"
        assert sorted(r[schema.SOURCE] for r in records(root, manifest)) == [
            f"{named}/cat/a.jpg", f"{named}/cat/b@2x.jpg", f"{named}/dog/c.png", f"{named}/dog/d e.jpg"]
        assert [d["uri"] for d in dead_letters(root, 1)] == [f"{named}/dog/missing.jpg"]
        assert SOURCE_ENV not in os.environ  # the job's workers had it; nothing after the job does

        code, again = ingest(source, root, *IN_MEMORY, *LENIENT, capsys=capsys)  # the names match the published ones
        assert code == 0 and not again["published"] and "nothing new" in again["message"], again
        code, refused = ingest(source.replace(TOKEN, "WRONG"), tmp_path / "other", *IN_MEMORY, capsys=None)
    printed = capsys.readouterr()
    assert code != 0 and printed.err.count("\n") == 1, printed.err
    assert holding(str(root)) == [] and holding(str(tmp_path / "other")) == []
    assert not shows(printed.out + printed.err)


def test_a_row_signed_on_its_own_is_read_with_its_query_and_one_with_a_user_info_is_refused_unread(site, tmp_path,
                                                                                                   capsys, s3_endpoint):
    """A row's query or fragment is read with and never named; a credential in what names the file (a user
    info, a path parameter) cannot be left out of its name, so the row is refused unread."""
    photos = os.path.join(site, "photos")
    for seed, name in enumerate(["t.jpg", "u.jpg"]):
        with open(os.path.join(photos, "cat", name), "wb") as f:
            f.write(images.rgb_jpeg(seed + 10))
    with open(os.path.join(photos, "manifest.csv"), "a") as f:
        f.write(f"cat/t.jpg?token={TOKEN},cat\ncat/u.jpg#access_token={TOKEN},cat\ncat/a.jpg?sig={TOKEN},cat\n"
                f"s3://{USER}:{TOKEN}@bucket/x.jpg,cat\nhttps://{TOKEN}@elsewhere/x.jpg,cat\n"
                f"cat/v;jsessionid={TOKEN}.jpg,cat\n")
    root = tmp_path / "root"
    with basic_auth_server(site) as port:
        named = f"http://{USER}:***@127.0.0.1:{port}/photos"
        source = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/photos/manifest.csv"
        code, summary = ingest(source, root, *IN_MEMORY, *LENIENT, "--allow-outside-source", capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 6, summary
    manifest = json.load(open(Root(str(root)).manifest(1)))
    assert {f"{named}/cat/t.jpg", f"{named}/cat/u.jpg"} < {r[schema.SOURCE] for r in records(root, manifest)}
    reasons = {d["uri"]: d["reason"] for d in dead_letters(root, 1)}
    assert reasons[f"s3://{USER}:***@bucket/x.jpg"] == reasons["https://***@elsewhere/x.jpg"] == CREDENTIAL_IN_NAME
    assert reasons["cat/v;jsessionid=***"] == CREDENTIAL_IN_NAME, reasons  # refused as the row names it
    assert holding(str(root)) == [] and not shows(json.dumps(summary))


def as_published_before(path: str, port: int) -> None:
    """A span's file as ingest wrote it when it named files with SOURCE's password."""
    with open(path, "rb") as f:
        data = f.read()
    packed = data[:2] == b"\x1f\x8b"
    text = (gzip.decompress(data) if packed else data).decode()
    text = text.replace(f"{USER}:***@127.0.0.1:{port}", f"{USER}:{json.dumps(PASSWORD)[1:-1]}@127.0.0.1:{port}")
    with open(path, "wb") as f:
        f.write(gzip.compress(text.encode(), mtime=0) if packed else text.encode())


def test_a_span_published_with_the_password_matches_by_name_and_lends_it_to_nothing_new(site, tmp_path, capsys):
    """Files a span published before Stoke kept credentials out are known by their names all the same (its
    source index is rebuilt without them), and no later span, dead letter or summary takes the password
    over from it: a copy of one of its images is a duplicate named without it."""
    root, photos = tmp_path / "root", os.path.join(site, "photos")
    with basic_auth_server(site) as port:
        source = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/photos/manifest.csv"
        assert ingest(source, root, *IN_MEMORY, *LENIENT, capsys=capsys)[0] == 0
        span = Root(str(root))
        for path in (span.manifest(1), span.source_index(1), span.content_index(1), span.dead_letter(1)):
            as_published_before(path, port)
        assert holding(str(root)) != []
        shutil.copy(os.path.join(photos, "cat", "a.jpg"), os.path.join(photos, "cat", "copy.jpg"))
        with open(os.path.join(photos, "manifest.csv"), "a") as f:
            f.write("cat/copy.jpg,cat\n")
        code, summary = ingest(source, root, *IN_MEMORY, *LENIENT, capsys=capsys)
    assert code == 0 and summary["new_sources"] == 1 and summary["duplicates"] == 1, summary
    named = f"http://{USER}:***@127.0.0.1:{port}/photos"
    assert summary["dead_letters"][0]["reason"].startswith(f"duplicate of {named}/cat/a.jpg"), summary
    kept = {os.path.join("data", "spans", "span-00001", name) for name in (MANIFEST, CONTENT_INDEX, DEAD_LETTER)}
    assert set(holding(str(root))) == kept  # what the old span holds, its source index rebuilt without it
    assert not shows(json.dumps(summary))
