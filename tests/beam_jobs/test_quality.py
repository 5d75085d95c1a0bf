"""Image quality at cleanvision's level: blurry, dark, light, low-information, strip-shaped, odd-sized and
grayscale images are named with their folders (reported) or set aside with their reason, as the settings
say; a data check names the reported ones. Real image files through the real Beam job."""
import collections

import numpy as np
from PIL import Image, ImageFilter
from tensorflow_metadata.proto.v0 import statistics_pb2

from beam_jobs import quality
from components.common.images import normalize
from components.common.spans import Spans
from components.contracts import schema
from components.contracts.config import IngestConfig
from components.contracts.layout import Root
from components.datacheck import datacheck
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest


def blurred(picture):
    return picture.filter(ImageFilter.GaussianBlur(10))


def darkened(picture):
    return Image.fromarray((np.asarray(picture, np.float32) * 0.15).astype(np.uint8))


def lightened(picture):
    return Image.fromarray((255 - (255 - np.asarray(picture, np.float32)) * 0.04).astype(np.uint8))


def posterized(picture):
    grey = np.asarray(picture.convert("L"))
    return Image.fromarray(np.where(grey > grey.mean(), 200, 60).astype(np.uint8)).convert("RGB")


def strip(picture):
    return picture.crop((0, 100, 320, 140))


def grey_as_rgb(picture):
    return picture.convert("L").convert("RGB")


def issues_of(picture, fmt="JPEG") -> set[str]:
    image = normalize(images.encode(picture, fmt, **({"quality": 90} if fmt == "JPEG" else {})))
    return set(quality.issues(image.pixels.quality.as_dict(), image.width, image.height,
                              quality.Rules.of(IngestConfig())))


def test_each_issue_is_found_in_the_one_decode_and_clean_photos_have_none():
    pictures = images.photo_crops(12)
    for index in (1, 5, 6, 7, 11):  # a blur the 64 px thumbnail shows (the others: docs/ingest.md#image-quality)
        assert issues_of(blurred(pictures[index])) == {"blurry"}
    for picture in pictures[:6]:
        assert issues_of(picture) == set()
        assert issues_of(darkened(picture)) >= {"dark"}
        assert issues_of(lightened(picture), "PNG") >= {"light"}
        assert issues_of(posterized(picture), "PNG") == {"low_information", "grayscale"}
        assert issues_of(strip(picture)) >= {"odd_aspect_ratio"}
        assert issues_of(grey_as_rgb(picture)) == {"grayscale"}
    sizes = [{"width": 320, "height": 240}] * 10 + [{"width": 321, "height": 240}, {"width": 24, "height": 18},
                                                      {"width": 1600, "height": 1200}]
    assert sorted(quality.odd_sizes(sizes, 3.0)) == [11, 12]  # a pixel more is no odd size


def test_quality_issues_are_reported_by_folder_and_the_data_check_names_them(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    pictures = images.photo_crops(12)
    made = {"cat": pictures[:8], "cat/night-cam": [darkened(p) for p in pictures[:3]],  # the same scenes, dark
            "cat/focus": [blurred(pictures[i]) for i in (1, 5, 11)], "dog": pictures[8:],
            "dog/strips": [strip(p) for p in pictures[6:8]]}
    for folder, found in made.items():
        (source / folder).mkdir(parents=True, exist_ok=True)
        for i, picture in enumerate(found):
            (source / folder / f"{i}.jpg").write_bytes(images.encode(picture, "JPEG", quality=90))
    code, summary = ingest(source, root, *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 20
    found = {f["kind"]: f for f in summary["quality"]}
    assert {k: f["count"] for k, f in found.items()} == {"blurry": 3, "dark": 3, "odd_aspect_ratio": 2, "odd_size": 2}
    assert found["blurry"]["folders"] == {str(source / "cat" / "focus"): 3}
    assert found["dark"]["examples"][0] == str(source / "cat" / "night-cam" / "0.jpg")
    counted = collections.Counter()
    for split in schema.SPLITS:
        stats = statistics_pb2.DatasetFeatureStatisticsList.FromString(open(Root(str(root)).statistics(1, split), "rb").read())
        counted.update({c.name: c.num for d in stats.datasets for f in d.features if f.path.step == [schema.ENCODED]
                        for c in f.custom_stats if c.name.startswith("quality.")})
    assert +counted == {"quality.blurry": 3, "quality.dark": 3, "quality.odd_aspect_ratio": 2, "quality.odd_size": 2}

    assert datacheck.run(["--root", str(root), "--json"]) == 0
    out = capsys.readouterr().out
    assert "images are blurry" in out and str(source / "dog" / "strips") in out
    record = Spans(str(root)).check_record(1).record
    warned = {a.issue: a for a in record.anomalies if a.kind == "image_quality"}
    assert record.status == "warning" and set(warned) == {"blurry", "dark", "odd_aspect_ratio", "odd_size"}
    assert warned["odd_aspect_ratio"].folders == {str(source / "dog" / "strips"): 2}
    assert warned["blurry"].message.endswith("; kept: set them aside with `--set ingest.quality_set_aside=blurry` "
                                             "(by hand: `stoke ingest --quality-set-aside blurry`)")

    code, summary = ingest(source, tmp_path / "aside", "--quality-set-aside", "blurry,dark,odd_aspect_ratio",
                           *IN_MEMORY, capsys=capsys)  # 8 of 20 set aside: no bad files, so the arrival passes
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 12
    assert summary["quality"] == []  # the strips, set aside in the job, were the odd sizes
    reasons = {d["uri"]: d["reason"] for d in dead_letters(tmp_path / "aside", 1)}
    assert reasons[str(source / "cat" / "focus" / "0.jpg")].startswith("blurry image: variance of the Laplacian ")
    assert reasons[str(source / "dog" / "strips" / "1.jpg")].startswith("odd aspect ratio: 320x40")
    assert summary["set_aside"] == {str(source / f): 3 for f in ("cat/night-cam", "cat/focus")} | {
        str(source / "dog" / "strips"): 2}


def test_a_picture_smaller_than_the_thumbnail_is_judged_as_its_larger_self():
    """The spread's threshold is on a 64 px thumbnail's counts: a 32x24 picture and the same picture with each
    pixel doubled (64x48, the same histogram's shares) have one spread, so the demo's 32 px digits (black,
    white strokes: a concentrated histogram) are no longer blurry, while a blurred photo shrunk to 48 px is."""
    from sklearn.datasets import load_digits

    small = images.photo_crops(1)[0].resize((32, 24), Image.BILINEAR)
    doubled = small.resize((64, 48), Image.NEAREST)
    spreads = [normalize(images.encode(p, "PNG")).pixels.quality.spread for p in (small, doubled)]
    assert spreads[0] == spreads[1] > 0
    for index in (1, 5, 6):
        assert "blurry" in issues_of(blurred(images.photo_crops(12)[index]).resize((48, 36), Image.BILINEAR), "PNG")
    digits = [Image.fromarray((d * 255 / 16).astype(np.uint8), "L").resize((32, 32), Image.BILINEAR).convert("RGB")
              for d in load_digits().images]
    assert collections.Counter(issue for d in digits for issue in issues_of(d, "PNG")) == {"grayscale": len(digits)}
