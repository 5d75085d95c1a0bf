"""Near-copies follow their original: re-encoded, resized, cropped, EXIF-rotated and mirrored copies of a
published image, or of another image of the same arrival, land in its split, never the other; tiny images
are never called near-copies. Real image files through the real Beam job."""
import json

from PIL import Image
from sklearn.datasets import load_digits

from beam_jobs.sources import split_of
from components.contracts import schema
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest, records

HALF = ["--eval-fraction", "0.5"]


def other_name(stem: str, label: str, avoid: str) -> str:
    """A file name whose own path hash would put it in the split that is not `avoid`."""
    return next(f"{stem}-{n}.jpg" for n in range(1000) if split_of(f"{label}/{stem}-{n}.jpg", 0.5) != avoid)


def splits_of(root, span) -> dict[str, str]:
    from components.contracts.layout import Root
    manifest = Root(str(root)).manifests([span], checked=False)[0].model_dump()
    return {r[schema.SOURCE]: r["split"] for r in records(root, manifest)}


def write_copies(folder, originals: dict[str, str]) -> dict[str, str]:
    """Every near-copy of each original, named so that its own path hash would take it to the other
    split; returns copy -> original."""
    made = {}
    for index, (original, split) in enumerate(sorted(originals.items())):
        picture = Image.open(original).convert("RGB")
        for variant, data in images.near_copies(picture).items():
            name = other_name(f"z-{variant}-{index}", "cat", split)
            (folder / "cat" / name).write_bytes(data)
            made[str(folder / "cat" / name)] = original
    return made


def test_near_copies_of_published_images_join_their_split(tmp_path, capsys):
    first, again, root = tmp_path / "first", tmp_path / "again", tmp_path / "root"
    (first / "cat").mkdir(parents=True)
    (again / "cat").mkdir(parents=True)
    for i, picture in enumerate(images.photo_crops(3)):
        (first / "cat" / f"{i}.jpg").write_bytes(images.encode(picture, "JPEG", quality=90))
    assert ingest(first, root, *HALF, *IN_MEMORY, capsys=capsys)[0] == 0
    published = splits_of(root, 1)
    made = write_copies(again, published)
    code, summary = ingest(again, root, *HALF, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == len(made) == 18
    landed = splits_of(root, 2)
    assert {copy: landed[copy] for copy in made} == {copy: published[original] for copy, original in made.items()}
    near = summary["near_duplicates"]
    assert near["count"] == 18 and near["moved"] == 18 and near["across"] == 0, near
    assert all(p["other_span"] == 1 and p["mirrored"] == ("-mirror-" in p["uri"]) for p in near["examples"])


def test_near_copies_within_one_arrival_follow_the_first_and_can_be_set_aside(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "cat").mkdir(parents=True)
    originals = {}
    for i, picture in enumerate(images.photo_crops(3)):
        path = source / "cat" / f"a-{i}.jpg"
        path.write_bytes(images.encode(picture, "JPEG", quality=90))
        originals[str(path)] = split_of(f"cat/a-{i}.jpg", 0.5)
    made = write_copies(source, originals)
    code, summary = ingest(source, root, *HALF, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 21
    landed = splits_of(root, 1)
    assert {copy: landed[copy] for copy in made} == {copy: landed[original] for copy, original in made.items()}
    assert summary["near_duplicates"]["moved"] == 18

    code, summary = ingest(source, tmp_path / "aside", *HALF, "--near-copies", "set_aside", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 3
    reasons = {d["uri"]: d["reason"] for d in dead_letters(tmp_path / "aside", 1)}
    assert set(reasons) == set(made) and summary["counts"]["duplicates"] == 18
    assert all(reasons[c].startswith(f"near-copy of {made[c]} (this span, split ") for c in made), reasons
    assert json.dumps(summary["near_duplicates"]) and summary["near_duplicates"]["set_aside"] == 18


def test_tiny_digits_are_not_called_near_copies_of_each_other(tmp_path, capsys):
    source, root = tmp_path / "digits", tmp_path / "root"
    digits = load_digits()
    for i in range(150):
        folder = source / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray((digits.images[i] * 255 / 16).astype("uint8"))
        (folder / f"{i:04d}.png").write_bytes(images.encode(picture, "PNG"))
    code, summary = ingest(source, root, *HALF, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 150
    assert summary["near_duplicates"]["count"] == 0, summary["near_duplicates"]
