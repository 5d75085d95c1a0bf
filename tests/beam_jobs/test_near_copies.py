"""Near-copies follow their original: re-encoded, resized, cropped, EXIF-rotated and mirrored copies of a
published image, or of another image of the same arrival, land in its split, never the other; tiny images
are never called near-copies, nor distinct pictures that dHash cannot tell apart (a fixed camera's frames,
the demo's digits), judged by their block colours. Real image files through the real Beam job."""
import base64
import json
import tracemalloc

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from beam_jobs.near_copies import BLOCK_RMS, NearRules, arrange, binomial_p
from beam_jobs.near_lookup import CROWD, Published
from beam_jobs.sources import split_of
from components.common.images import normalize
from components.common.signatures import distance, pixels_of
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
            "width": 64, "height": 64, "blocks": base64.b64encode(bytes(192)).decode(), **more}


def coloured(level: int) -> str:
    """Block colours of one grey level everywhere, as a signature holds them."""
    return base64.b64encode(bytes([level]) * 192).decode()


def test_one_picture_is_copies_whose_block_colours_agree_however_few_and_whoever_they_follow(tmp_path):
    """Three images that dHash alone calls copies of a fourth (too few for a crowd) are one picture only where
    their block colours agree; twenty that the job sent after one published picture (whose block colours are not
    kept) are judged among themselves: twenty pictures are no copies of it and take back their own split, twenty
    copies of one picture are one picture and stay with it."""
    published = tmp_path / "near-published.npz"
    np.savez(published, hashes=np.array([0xF], np.uint64), splits=np.array([1], np.uint8),
             spans=np.array([1], np.uint32), offsets=np.array([0, 5], np.uint64), uris=np.frombuffer(b"p.jpg", np.uint8))
    near = {"row": 0, "split": "eval", "distance": 0, "mirrored": False, "moved": True}  # each was train by its path
    few = [signature(f"few/{i}.jpg", 0xF0F0, blocks=coloured(10 * i)) for i in range(4)]
    same = [signature(f"same/{i}.jpg", 0xF0F0F0F0F0, blocks=coloured(200)) for i in range(4)]
    frames = [signature(f"frames/{i:02d}.jpg", 0xF, "eval", near=dict(near), blocks=coloured(10 * i)) for i in range(20)]
    arranged = arrange(few + same + frames, NearRules("follow", 6, 16), str(published))
    assert arranged.report.count == 3 + 3 and arranged.report.crowded == 20
    assert [[s["uri"] for s in group] for group in arranged.pictures] == [[s["uri"] for s in same]]
    assert {s["split"] for s in frames} == {"train"} and arranged.moved == frames  # out of the shards the job wrote

    stuck = [signature(f"stuck/{i:02d}.jpg", 0xF, "eval", near=dict(near), blocks=coloured(100)) for i in range(20)]
    arranged = arrange(stuck, NearRules("follow", 6, 16), str(published))
    assert [len(group) for group in arranged.pictures] == [20] and arranged.report.count == 20
    assert {s["split"] for s in stuck} == {"eval"} and arranged.moved == []


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


def test_the_demo_digits_alike_to_dhash_keep_their_split_and_raise_no_warning(tmp_path):
    """The demo's 1,797 digits enlarged to 32 px are distinct pictures, yet 93% have another within 6 bits:
    followed by dHash alone, eval kept 4% of them and the run opened with a warning. Most lie in crowds,
    whose block colours tell the digits apart, so eval keeps the share the path hash gives."""
    write_digits(str(tmp_path))
    kept = []
    for path in sorted(tmp_path.rglob("*.png")):
        key, pixels = str(path.relative_to(tmp_path)), pixels_of(Image.open(path).convert("RGB"))
        kept.append(signature(key, int(pixels.dhash, 16), split_of(key, 0.1), mirror=pixels.mirror,
                              blocks=base64.b64encode(pixels.blocks).decode()))
    arranged = arrange(kept, NearRules("follow", 6, 16, 0.1), None)
    near, held = arranged.report, sum(s["split"] == "eval" for s in kept)
    assert near.warning is None, near.warning
    assert near.crowded > len(kept) / 2
    assert near.count < len(kept) / 5 and binomial_p(held, len(kept), 0.1) > 0.01, (near.count, held)


def test_copies_that_move_eval_far_from_its_share_are_named():
    """Forty copies of one picture (the same blocks) in a crowd are copies still: they follow it, and the
    summary says that this moved eval and which setting keeps each image's own split."""
    blocks = base64.b64encode(bytes(range(192))).decode()
    kept = [signature(f"c/{i:02d}.jpg", 0xF0F0, split_of(f"c/{i:02d}.jpg", 0.5), blocks=blocks) for i in range(41)]
    kept[0]["split"] = "train"
    arranged = arrange(kept, NearRules("follow", 6, 16, 0.5), None)
    near = arranged.report
    assert near.count == 40 and near.crowded == 41 and {s["split"] for s in kept} == {"train"}
    assert near.warning and near.warning.startswith("following near-copies left eval 0 of 41 new images (0.0%")
    assert "ingest.near_copies report" in near.warning and "\n" not in near.warning


def blocks_apart(a: bytes, b: bytes, mirrored: bool = False) -> float:
    """Root mean square difference of two block colour signatures, the second read mirrored if asked."""
    first, second = (np.frombuffer(x, np.uint8).astype(float) for x in (a, b))
    second = second.reshape(8, 8, 3)[:, ::-1].reshape(-1) if mirrored else second
    return float(np.sqrt(np.mean((first - second) ** 2)))


def test_block_colours_tell_re_uploads_from_other_frames_of_one_camera():
    """A picture's re-encodes, halving, EXIF turn and mirror image stay within BLOCK_RMS of its block colours
    (photographs, a camera's frames, a 32 px digit); two frames of one camera that dHash calls near-copies
    (the same gradient in another colour, another product on the belt) are farther, as are two digits."""
    pictures = images.photo_crops(4) + images.camera_frames(3) + images.conveyor_frames(3)
    digits = load_digits().images[:3]
    pictures += [Image.fromarray((d * 255 / 16).astype("uint8")).resize((32, 32), Image.BILINEAR).convert("RGB")
                 for d in digits]
    for picture in pictures:
        original = normalize(images.encode(picture, "PNG"), 512).pixels.blocks
        for variant, data in images.near_copies(picture).items():
            if variant != "crop":  # a crop moves the block grid: see test_a_crowd_of_frames...
                copy = normalize(data, 512).pixels.blocks
                assert blocks_apart(original, copy, variant == "mirror") < BLOCK_RMS, variant
    for frames in (images.camera_frames(40), images.conveyor_frames(40), pictures[-3:]):
        signed = [normalize(images.encode(f, "JPEG", quality=90), 512).pixels for f in frames]
        near = [(a, b) for i, a in enumerate(signed) for b in signed[i + 1:] if distance(a.dhash, b.dhash) <= 6]
        assert near and min(blocks_apart(a.blocks, b.blocks) for a, b in near) > BLOCK_RMS


def test_a_crowd_of_frames_keeps_its_splits_and_copies_of_a_frame_still_follow(tmp_path, capsys):
    """Thirty frames of a fixed camera share one dHash: followed by it alone, all joined the first frame's
    split. Judged by block colours each keeps its own, while a frame's re-encodes, halving, light crop,
    EXIF turn and mirror image (named so their own path hash would take them to the other split) follow it.
    A second arrival of other frames, alike to the published ones, is no copy of them either."""
    source, root = tmp_path / "first", tmp_path / "root"
    (source / "cam").mkdir(parents=True)
    (source / "cat").mkdir()  # the copies' folder (write_copies)
    frames = images.camera_frames(50)
    for i, frame in enumerate(frames[:30]):
        (source / "cam" / f"frame-{i:03d}.jpg").write_bytes(images.encode(frame, "JPEG", quality=90))
    made = write_copies(source, {str(source / "cam" / f"frame-{i:03d}.jpg"): split_of(f"cam/frame-{i:03d}.jpg", 0.5)
                                 for i in (3, 7)})
    code, summary = ingest(source, root, *HALF, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 42
    landed = splits_of(root, 1)
    assert {uri: landed[uri] for uri in landed if "frame-" in uri} == \
        {uri: split_of(uri.split("first/")[1], 0.5) for uri in landed if "frame-" in uri}
    assert {copy: landed[copy] for copy in made} == {copy: landed[original] for copy, original in made.items()}
    near = summary["near_duplicates"]
    assert near["count"] == 12 and near["crowded"] == 42 and near["warning"] is None, near

    again = tmp_path / "again"
    (again / "cam").mkdir(parents=True)
    for i, frame in enumerate(frames[30:]):
        (again / "cam" / f"later-{i:03d}.jpg").write_bytes(images.encode(frame, "JPEG", quality=90))
    code, summary = ingest(again, root, *HALF, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["near_duplicates"]["crowded"] == 20 and summary["near_duplicates"]["count"] == 0
    assert splits_of(root, 2) == {uri: split_of(uri.split("again/")[1], 0.5) for uri in splits_of(root, 2)}


def night(folder, frames, stem: str) -> dict[str, str]:
    """The frames written as JPEGs under folder/cam; their URIs -> the split their own path hash gives."""
    (folder / "cam").mkdir(parents=True, exist_ok=True)
    for i, frame in enumerate(frames):
        (folder / "cam" / f"{stem}-{i:03d}.jpg").write_bytes(images.encode(frame, "JPEG", quality=90))
    return {str(folder / "cam" / f"{stem}-{i:03d}.jpg"): split_of(f"cam/{stem}-{i:03d}.jpg", 0.5)
            for i in range(len(frames))}


def test_distinct_frames_after_a_few_published_ones_keep_their_splits_and_a_stuck_cameras_follow(tmp_path, capsys):
    """A first night of three frames, then 57 other frames of the passing object: each new one lies within a few
    bits of a published one and was sent after it, all into its split (eval kept none). They are 57 pictures by
    their block colours, more than a picture's handful of forms, so they keep their own splits. Twenty frames of a
    stuck camera, after one published frame, are one picture, and still follow it."""
    frames, root = images.passing_frames(60), tmp_path / "root"
    night(tmp_path / "first", [frames[i] for i in (0, 25, 47)], "first")
    assert ingest(tmp_path / "first", root, *HALF, *IN_MEMORY, capsys=capsys)[0] == 0
    own = night(tmp_path / "second", [f for i, f in enumerate(frames) if i not in (0, 25, 47)], "second")
    code, summary = ingest(tmp_path / "second", root, *HALF, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["near_duplicates"]["warning"] is None, summary["near_duplicates"]
    landed = splits_of(root, 2)
    assert sum(landed[uri] != split for uri, split in own.items()) <= 3, landed  # a few that dHash alone judged

    stuck, again = images.stuck_frames(21), tmp_path / "again"
    night(tmp_path / "stuck", stuck[:1], "first")
    assert ingest(tmp_path / "stuck", again, *HALF, *IN_MEMORY, capsys=capsys)[0] == 0
    (published,) = splits_of(again, 1).values()
    own = night(tmp_path / "stuck2", stuck[1:], "second")
    code, summary = ingest(tmp_path / "stuck2", again, *HALF, *IN_MEMORY, capsys=capsys)
    assert code == 0 and set(splits_of(again, 2).values()) == {published} != set(own.values()), summary


def test_settling_an_arrival_of_alike_pictures_holds_memory_in_proportion_to_it():
    """Three thousand pictures alike at 9x8 made 4.5 million pairs of near-copies, hundreds of MB in lists:
    now each image looks at the originals that share a band with it, and a crowd at a window of them."""
    rng = np.random.default_rng(0)
    kept = [signature(f"a/{i:05d}.jpg", 0x0F0F_F0F0_1234_5678, split_of(f"a/{i:05d}.jpg", 0.1),
                      blocks=base64.b64encode(rng.integers(0, 256, 192, dtype=np.uint8).tobytes()).decode())
            for i in range(3000)]
    tracemalloc.start()
    try:
        arranged = arrange(kept, NearRules("follow", 6, 16, 0.1), None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 30e6, f"{peak / 1e6:.0f} MB"
    assert arranged.report.crowded == 3000 and arranged.report.count == 0


def test_a_published_crowd_names_no_original(tmp_path):
    """A lookup among published hashes that more than CROWD share as nearly cannot say which one an image
    copies (published records keep no block colours): it says so instead of naming the first of them."""
    count = CROWD + 5
    uris = b"".join(f"p{i:02d}.jpg".encode() for i in range(count))
    np.savez(tmp_path / "near.npz", hashes=np.full(count, 0xABCD, np.uint64), splits=np.arange(count, dtype=np.uint8) % 2,
             spans=np.ones(count, np.uint32), offsets=np.arange(0, 7 * count + 1, 7, dtype=np.uint64),
             uris=np.frombuffer(uris, np.uint8))
    published = Published(str(tmp_path / "near.npz"), 6)
    assert published.match(f"{0xABCD:016x}", f"{0xFFFF:016x}") == {"crowded": True}
    assert published.match(f"{0xABCF:016x}", f"{0xFFFF:016x}") == {"crowded": True}  # as near to each
    np.savez(tmp_path / "few.npz", hashes=np.array([0xABCD] * 3 + [0xABCC], np.uint64), splits=np.array([1, 0, 0, 0], np.uint8),
             spans=np.ones(4, np.uint32), offsets=np.arange(0, 29, 7, dtype=np.uint64), uris=np.frombuffer(uris[:28], np.uint8))
    few = Published(str(tmp_path / "few.npz"), 6)
    assert few.match(f"{0xABCD:016x}", f"{0xFFFF:016x}") == {"row": 0, "split": "eval", "distance": 0, "mirrored": False}
    assert few.match(f"{0xABCC:016x}", f"{0xFFFF:016x}")["row"] == 3  # the nearest, alone at its distance


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
