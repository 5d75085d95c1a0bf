"""Ingest's per-image checks, computed in one decode with few passes (components/common/signatures.py,
quality.py), against the plainest computation of each measure from its definition: per pixel in numpy,
bits one by one, on pictures this test makes; then the same through the real Beam job, as the span's
content index, statistics and quality counts hold them."""
import io
import json
import math

import numpy as np
import pytest
from PIL import Image, ImageFilter
from tensorflow_metadata.proto.v0 import statistics_pb2

from beam_jobs import quality
from components.common import images as normalizing
from components.common.content_index import read_index
from components.common.image_header import open_image
from components.common.images import normalize
from components.contracts.config import IngestConfig
from components.contracts.layout import Root
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, ingest
from tests.beam_jobs.test_quality import blurred, darkened, grey_as_rgb, lightened, posterized, strip

MAX_SIDE = IngestConfig().max_side


def pictures() -> dict[str, bytes]:
    """Files of every path through normalize: kept as they came (JPEG at a DCT scale, RGB PNG), re-encoded
    (too large, EXIF-rotated, with alpha), small, and each quality issue."""
    photos = images.photo_crops(6)
    made = {f"photo{i}.jpg": images.encode(p, "JPEG", quality=90) for i, p in enumerate(photos[:4])}
    made.update({
        "photo.png": images.encode(photos[4], "PNG"),
        "blurred.jpg": images.encode(blurred(photos[1]), "JPEG", quality=90),
        "dark.jpg": images.encode(darkened(photos[2]), "JPEG", quality=90),
        "light.png": images.encode(lightened(photos[3]), "PNG"),
        "posterized.png": images.encode(posterized(photos[0]), "PNG"),
        "strip.jpg": images.encode(strip(photos[5]), "JPEG", quality=90),
        "grey.jpg": images.encode(grey_as_rgb(photos[5]), "JPEG", quality=90),
        "small.jpg": images.encode(photos[2].resize((40, 30)), "JPEG", quality=90),
        "large.jpg": images.encode(photos[1].resize((1280, 960), Image.BICUBIC), "JPEG", quality=90),
        "sideways.jpg": images.stored_sideways(photos[4]),
        "mirrored.jpg": images.encode(photos[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT), "JPEG", quality=90),
        "alpha.png": images.rgba_png(),
    })
    return made


def as_decoded(data: bytes) -> Image.Image:
    """The picture ingest measures: an RGB JPEG or PNG it keeps, decoded as ingest verifies it (a JPEG at the
    DCT scale that leaves 64 px); anything it re-encodes, as it re-encodes it."""
    image = Image.open(io.BytesIO(data))
    turned = image.getexif().get(0x0112, 1) != 1
    if image.format == "JPEG" and image.mode == "RGB" and not turned and max(image.size) <= MAX_SIDE:
        ratio = max(1 / 8, min(1.0, 64 / max(image.size)))
        image.draft("RGB", (math.ceil(image.width * ratio), math.ceil(image.height * ratio)))
        image.load()
        return image
    if image.format == "PNG" and image.mode == "RGB" and "transparency" not in image.info:
        return image.convert("RGB")
    return normalizing._to_rgb(open_image(data, None), MAX_SIDE)


def dhash(thumb: np.ndarray) -> str:
    bits = "".join("1" if thumb[y, x] > thumb[y, x + 1] else "0" for y in range(8) for x in range(8))
    return f"{int(bits, 2):016x}"


def reference(image: Image.Image) -> dict:
    """Each measure from its definition (components/common/signatures.py, quality.py)."""
    grey = np.asarray(image.convert("L")).astype(np.float64)
    nine = np.asarray(image.convert("L").resize((9, 8), Image.BILINEAR)).astype(np.int64)
    size = image.size
    if max(image.size) > 64:
        ratio = 64 / max(image.size)
        image = image.resize((max(1, round(image.width * ratio)), max(1, round(image.height * ratio))),
                             Image.BILINEAR, reducing_gap=2.0)
    rgb = np.asarray(image.convert("RGB")).reshape(-1, 3).astype(np.float64)
    brightness = np.sort(np.sqrt(0.241 * rgb[:, 0] ** 2 + 0.691 * rgb[:, 1] ** 2 + 0.068 * rgb[:, 2] ** 2) / 255)
    thumb = image.convert("L")
    _, counts = np.unique(grey, return_counts=True)
    shares = counts / counts.sum()
    # a smaller picture's counts, as many as a 64 px thumbnail of a larger one of its shape would count
    scale = round(size[0] * 64 / max(size)) * round(size[1] * 64 / max(size)) / (size[0] * size[1])
    rgb_thumb = np.asarray(image.convert("RGB")).astype(np.float64)
    return {"dhash": dhash(nine), "mirror": dhash(nine[:, ::-1]), "mean": grey.mean(), "std": grey.std(),
            "sharpness": np.asarray(thumb.filter(ImageFilter.FIND_EDGES)).astype(np.float64).var(),
            "spread": np.bincount(np.asarray(thumb).ravel(), minlength=256).std() * (scale if max(size) < 64 else 1),
            "dark": brightness[int(0.99 * (len(brightness) - 1))], "light": brightness[int(0.05 * (len(brightness) - 1))],
            "entropy": float(-(shares * np.log2(shares)).sum()),
            "colour": int((rgb.max(axis=1) - rgb.min(axis=1)).max()), "blocks": block_means(rgb_thumb)}


def block_means(rgb: np.ndarray) -> np.ndarray:
    """The mean colour of each block of an 8x8 grid over the picture: of the pixels whose centre lies in it,
    a centre on an edge in the block before it (PIL's box filter: -0.5 < x <= 0.5)."""
    height, width = rgb.shape[:2]
    rows, cols = (np.ceil((np.arange(n) + 0.5) * 8 / n) - 1 for n in (height, width))  # the block of each centre
    return np.array([[rgb[rows == b][:, cols == a].reshape(-1, 3).mean(axis=0) for a in range(8)] for b in range(8)])


# Each measure is stored rounded: to this many places (the last can differ where the rounding ties).
PLACES = {"mean": 3, "std": 3, "sharpness": 2, "spread": 2, "dark": 4, "light": 4, "entropy": 3}


def measured(data: bytes) -> dict:
    pixels = normalize(data, MAX_SIDE).pixels
    return {"dhash": pixels.dhash, "mirror": pixels.mirror, "mean": pixels.mean, "std": pixels.std,
            **pixels.quality.as_dict(), "blocks": np.frombuffer(pixels.blocks, np.uint8).reshape(8, 8, 3)}


@pytest.mark.parametrize("name", sorted(pictures()))
def test_each_measure_is_the_plain_computation_of_its_definition(name):
    data = pictures()[name]
    found, expected = measured(data), reference(as_decoded(data))
    assert {k: found[k] for k in ("dhash", "mirror", "colour")} == {k: expected[k] for k in ("dhash", "mirror", "colour")}
    for key, places in PLACES.items():
        assert found[key] == pytest.approx(expected[key], abs=1.01 * 10 ** -places), key
    assert np.abs(found["blocks"] - expected["blocks"]).max() <= 1  # PIL's box filter rounds in fixed point
    rules = quality.Rules.of(IngestConfig())
    image = normalize(data, MAX_SIDE)
    assert quality.issues(found, image.width, image.height, rules).keys() == \
        quality.issues(expected, image.width, image.height, rules).keys()


def test_the_measures_cover_each_issue_and_path():
    """The set is worth comparing on: every per-image issue, shrunk, turned and kept images among them."""
    rules, found, reencoded = quality.Rules.of(IngestConfig()), set(), set()
    for name, data in pictures().items():
        image = normalize(data, MAX_SIDE)
        found |= quality.issues(measured(data), image.width, image.height, rules).keys()
        reencoded |= {name} if image.reencoded else set()
    assert found == {"blurry", "dark", "light", "low_information", "odd_aspect_ratio", "grayscale"}
    assert {"large.jpg", "sideways.jpg", "alpha.png"} <= reencoded and "photo0.jpg" not in reencoded


def test_the_job_publishes_the_plain_computations(tmp_path, capsys):
    source, root = tmp_path / "source", tmp_path / "root"
    expected = {}
    for index, (name, data) in enumerate(sorted(pictures().items())):
        path = source / ("a" if index % 2 else "b") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        expected[str(path)] = reference(as_decoded(data)) | {"size": normalize(data, MAX_SIDE)}
    code, summary = ingest(source, root, "--near-copies", "report", "--blank-std", "0", *IN_MEMORY, capsys=capsys)
    assert code == 0 and summary["counts"]["dead_letter"] == 0
    span, manifest = Root(str(root)), json.loads(open(Root(str(root)).manifest(1)).read())
    lines = list(read_index(span.content_index(1), 1, len(expected)))
    assert {json.loads(line.split("\t")[4]): line.split("\t")[1] for line in lines} == \
        {uri: e["dhash"] for uri, e in expected.items()}
    splits = {json.loads(line.split("\t")[4]): line.split("\t")[2] for line in lines}
    rules = quality.Rules.of(IngestConfig())
    for split in ("train", "eval"):
        mine = [e for uri, e in expected.items() if splits[uri] == split]
        stats = statistics_pb2.DatasetFeatureStatisticsList.FromString(open(span.statistics(1, split), "rb").read())
        custom = {c.name: c.num for f in stats.datasets[0].features for c in f.custom_stats}
        if not mine:
            continue
        assert custom["pixel_mean.mean"] == pytest.approx(np.mean([e["mean"] for e in mine]), abs=1e-3)
        assert custom["pixel_std.max"] == pytest.approx(max(e["std"] for e in mine), abs=1e-3)
        counts = {issue: 0 for issue in quality.WORDS}
        for e in mine:
            for issue in quality.issues(e, e["size"].width, e["size"].height, rules):
                counts[issue] += 1
        assert {k[len("quality."):]: v for k, v in custom.items() if k.startswith("quality.") and k != "quality.odd_size"} \
            == {k: v for k, v in counts.items() if k != "odd_size"}
    assert sum(f["count"] for f in manifest["quality"]) >= 6
