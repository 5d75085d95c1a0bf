"""A new version with the content already published (touch, a re-upload of the same bytes) is not new."""
import os

from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, ingest
from tests.beam_jobs.test_sources import write


def test_touching_every_file_publishes_nothing_and_says_so(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    for i in range(17):
        write(source / ("cat" if i % 2 else "dog") / f"{i}.jpg", images.rgb_jpeg(seed=i))
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["counts"]["train"] > 0
    for path in source.rglob("*.jpg"):
        os.utime(path, (5, 5))
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and not summary["published"] and summary["unchanged"] == 17
    assert summary["message"].startswith(f"nothing new in {source}") and "recognised by content" in summary["message"]
    assert sorted(os.listdir(root / "data" / "spans")) == ["span-00001"]


def test_rewritten_bytes_through_a_manifest_and_a_real_change_beside_them(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    for i in range(3):
        write(source / "img" / f"{i}.png", images.rgb_png(seed=i))
    (source / "m.csv").write_text("".join(f"img/{i}.png,cat\n" for i in range(3)))
    assert ingest(source / "m.csv", root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    write(source / "img" / "0.png", images.rgb_png(seed=0))  # the same bytes again: a new mtime
    os.utime(source / "img" / "1.png", (9, 9))
    write(source / "img" / "2.png", images.rgb_png(seed=5))  # changed content: new
    code, summary = ingest(source / "m.csv", root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["span"] == 2 and summary["new_sources"] == 1 and summary["unchanged"] == 2
