import pytest

from tests.beam_jobs import images


@pytest.fixture
def awkward_folder(tmp_path):
    """Class folders holding every awkward-but-valid kind, nested folders, sidecars and broken files."""
    source = tmp_path / "source"
    for index, (name, make) in enumerate(sorted(images.AWKWARD.items())):
        folder = source / ("cat" if index % 2 else "dog") / ("nested/deeper" if index % 3 == 0 else "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(make())
    for name, make in images.BROKEN.items():
        (source / "dog" / name).write_bytes(make())
    (source / "dog" / "labels.txt").write_text("a sidecar, not an image")
    (source / "cat" / ".DS_Store").write_bytes(b"\0\0")
    return source
