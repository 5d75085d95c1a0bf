"""Files below a path longer than the system allows are dead letters, never skipped in silence."""
import os

from beam_jobs.sources import list_source
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest

TOO_LONG = "path longer than the system allows (PATH_MAX 4096): nothing below this folder is read"


def deep(base, depth=20):
    """A file below a path of about 5,000 characters, made with relative steps."""
    here = os.getcwd()
    os.makedirs(base, exist_ok=True)
    os.chdir(base)
    try:
        for _ in range(depth):
            os.mkdir("d" * 250)
            os.chdir("d" * 250)
        with open("x.jpg", "wb") as f:
            f.write(images.rgb_jpeg())
    finally:
        os.chdir(here)


def test_a_folder_too_deep_to_list_is_a_dead_letter(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    deep(source / "cat")
    (source / "cat" / "ok.jpg").write_bytes(images.rgb_jpeg(seed=1))
    listing = list_source(str(source), 0.0)
    assert [s.key for s in listing.sources] == ["cat/ok.jpg"]
    [(refused, reason)] = listing.rejected
    assert reason == TOO_LONG and len(refused.uri) > 4096
    code, summary = ingest(source, root, "--max-bad-fraction", "1", *IN_MEMORY, capsys=capsys)
    assert code == 0 and [d["reason"] for d in dead_letters(root, 1)] == [TOO_LONG]
