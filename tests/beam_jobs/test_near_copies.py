"""Near-copies follow their original: re-encoded, resized, cropped, EXIF-rotated and mirrored copies of a
published image, or of another image of the same arrival, land in its split, never the other; tiny images
are never called near-copies. Real image files through the real Beam job."""
import json

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from beam_jobs.near_copies import NearRules, arrange, binomial_p
from beam_jobs.sources import split_of
from components.common.signatures import pixels_of
from components.common.spans import Spans
from components.contracts import schema
from flows.demo import write_digits
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest, records

HALF = ["--eval-fraction", "0.5"]


def other_name(stem: str, label: str, avoid: str) -> str:
    """A file name whose own path hash would put it in the split that is not `avoid`."""
    return next(f"{stem}-{n}.jpg" for n in range(1000) if split_of(f"{label}/{stem}-{n}.jpg", 0.5) != avoid)


def splits_of(root, span) -> dict[str, str]:
    manifest = Spans(str(root)).manifests([span], checked=False)[0].model_dump()
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


def signature(uri: str, dhash: int, split: str = "train", **more) -> dict:
    return {"uri": uri, "dhash": f"{dhash:016x}", "mirror": f"{~dhash & (2**64 - 1):016x}", "split": split,
            "width": 64, "height": 64, **more}


def test_a_chain_of_alike_pictures_follows_originals_not_copies():
    """Each a few bits from the one before (4 bits a step, the threshold 6): a copy of a copy is no
    copy of the original, so the chain cuts into groups of an original and its copies, each keeping
    the original's split, instead of carrying the first one's split along all of them."""
    chain, step = [], 0
    for i in range(8):
        chain.append(signature(f"c/{i}.jpg", step, "eval" if i % 4 == 2 else "train"))
        step ^= 0xF << (4 * i)
    arranged = arrange(chain, NearRules("follow", 6, 16), None)
    assert [s["split"] for s in chain] == ["train"] * 2 + ["eval"] * 2 + ["train"] * 2 + ["eval"] * 2
    assert [(p.uri, p.other_uri) for p in arranged.report.examples] == [
        ("c/1.jpg", "c/0.jpg"), ("c/3.jpg", "c/2.jpg"), ("c/5.jpg", "c/4.jpg"), ("c/7.jpg", "c/6.jpg")]
    assert arranged.report.moved == 2 and arranged.report.warning is None


def test_a_copy_of_a_published_image_is_no_original_for_the_arrival(tmp_path):
    published = tmp_path / "near-published.npz"
    np.savez(published, hashes=np.array([0xF], np.uint64), splits=np.array([1], np.uint8),
             spans=np.array([1], np.uint32), offsets=np.array([0, 5], np.uint64), uris=np.frombuffer(b"p.jpg", np.uint8))
    near = {"row": 0, "split": "eval", "distance": 4, "mirrored": False, "moved": True}  # as the job found it
    first = signature("a/0.jpg", 0xFF, "eval", near=near)  # 4 bits from the published 0xF
    second = signature("a/1.jpg", 0xFFF, "train")  # 4 bits from the first, 8 from what it copies
    arranged = arrange([first, second], NearRules("follow", 6, 16), str(published))
    assert second["split"] == "train" and arranged.report.count == 1 and arranged.report.moved == 1


def test_pictures_alike_to_dhash_that_move_eval_far_from_its_share_are_named(tmp_path):
    """The demo's digits enlarged to 32 px are distinct pictures, yet 93% have another within 6 bits:
    the gate would judge on what is left of eval. Following them is the default, so the summary says
    what moved eval and which setting keeps them apart (an exact binomial test against the share)."""
    write_digits(str(tmp_path))
    kept = []
    for path in sorted(tmp_path.rglob("*.png")):
        key, pixels = str(path.relative_to(tmp_path)), pixels_of(Image.open(path).convert("RGB"))
        kept.append(signature(key, int(pixels.dhash, 16), split_of(key, 0.1), mirror=pixels.mirror))
    hashed = sum(s["split"] == "eval" for s in kept)
    arranged = arrange(kept, NearRules("follow", 6, 16, 0.1), None)
    near = arranged.report
    assert near.count > len(kept) / 2
    assert near.warning and "ingest.near_copies report" in near.warning, near
    assert f"left eval {sum(s['split'] == 'eval' for s in kept)} of {len(kept)}" in near.warning
    assert hashed != sum(s["split"] == "eval" for s in kept)

    again = [{**s, "split": split_of(s["uri"], 0.1)} for s in kept]  # as listed, before any move
    assert arrange(again, NearRules("report", 6, 16, 0.1), None).report.warning is None  # nothing moved


@pytest.mark.parametrize("k, n, p, published", [
    (3, 15, 0.1, 0.184),  # scipy.stats.binomtest's documented example: "The p-value is 0.184"
    (0, 10, 0.5, 2 / 1024),  # no head in ten fair tosses, or no tail: 2 of the 1,024 sequences
    (5, 10, 0.5, 1.0),
])
def test_the_binomial_test_gives_published_values_and_scipys(k, n, p, published):
    from scipy.stats import binomtest

    assert binomial_p(k, n, p) == pytest.approx(published, abs=5e-4)
    for case in [(k, n, p), (73, 1797, 0.1), (3, 1797, 0.1), (593, 6000, 0.1), (7, 50, 0.02), (1, 1, 0.1)]:
        assert binomial_p(*case) == pytest.approx(binomtest(*case).pvalue, rel=1e-9)


def test_a_chain_through_mirror_images_cuts_at_copies_too():
    """The second is the first mirrored (its mirror's hash 4 bits from the first), the third the second
    mirrored back (4 bits from the second's mirror, 8 from the first): a copy of a copy again."""
    near = 0xF
    chain = [signature("m/0.jpg", 0, "train"),
             {**signature("m/1.jpg", ~near & (2**64 - 1), "eval"), "mirror": f"{near:016x}"},
             signature("m/2.jpg", 0xFF, "eval")]
    arranged = arrange(chain, NearRules("follow", 6, 16), None)
    assert [s["split"] for s in chain] == ["train", "train", "eval"]
    assert [(p.uri, p.other_uri, p.mirrored) for p in arranged.report.examples] == [("m/1.jpg", "m/0.jpg", True)]


@pytest.mark.parametrize("mode, kept, count", [("set_aside", ["c/0.jpg", "c/2.jpg"], 1), ("report", None, 1)])
def test_every_mode_takes_a_chain_as_originals_and_their_copies(mode, kept, count):
    chain = [signature(f"c/{i}.jpg", (1 << (4 * i)) - 1) for i in range(3)]  # 0, 4 and 8 bits from the first
    arranged = arrange(chain, NearRules(mode, 6, 16), None)
    assert arranged.report.count == count
    assert [s["uri"] for s, _ in arranged.dropped] == ([] if kept is None else ["c/1.jpg"])
