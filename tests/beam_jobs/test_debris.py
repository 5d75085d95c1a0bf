"""A folder holding a _MANIFEST.json is a published span: never removed as debris, whatever its name."""
import shutil

from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, ingest


def published_once(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    (source / "cat" / "a.jpg").write_bytes(images.rgb_jpeg())
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 1
    (source / "cat" / "b.jpg").write_bytes(images.rgb_jpeg(seed=2))
    return source, root, root / "data" / "spans"


def test_a_span_restored_under_another_number_is_kept_and_stops_ingest(tmp_path, capsys):
    source, root, spans = published_once(tmp_path, capsys)
    shutil.copytree(spans / "span-00001", spans / "span-00007")  # a backup restored as span 7
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and summary["error"] == (
        f"{spans / 'span-00007'} holds the manifest of span 1: move it back to span-00001 or remove it by hand; "
        "nothing was changed")
    assert (spans / "span-00007" / "_MANIFEST.json").exists()

    shutil.rmtree(spans / "span-00007")  # the user removes it by hand: ingest goes on
    assert ingest(source, root, *IN_MEMORY, capsys=capsys)[1]["span"] == 2


def test_a_span_moved_to_another_number_or_into_a_staging_name_is_never_removed(tmp_path, capsys):
    source, root, spans = published_once(tmp_path, capsys)
    (spans / "span-00001").rename(spans / "span-00003")
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and "move it back to span-00001" in summary["error"]
    assert (spans / "span-00003" / "_MANIFEST.json").exists()

    (spans / "span-00003").rename(spans / "_staging-restored")
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 1 and "a published span is never removed as debris" in summary["error"]
    assert (spans / "_staging-restored" / "_MANIFEST.json").exists()


def test_folders_without_a_manifest_are_still_debris(tmp_path, capsys):
    source, root, spans = published_once(tmp_path, capsys)
    (spans / "span-00002").mkdir()
    (spans / "_staging-abc").mkdir()
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["span"] == 3 and len(summary["removed_debris"]) == 2
    assert sorted(p.name for p in spans.iterdir()) == ["span-00001", "span-00003"]
