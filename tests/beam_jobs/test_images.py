import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

from components.common.images import Rejected, normalize
from tests.beam_jobs import images


def decode(data: bytes) -> np.ndarray:
    return tf.io.decode_image(data, expand_animations=False).numpy()


@pytest.mark.parametrize("name", sorted(images.AWKWARD))
def test_every_valid_kind_decodes_to_8bit_rgb(name):
    result = normalize(images.AWKWARD[name]())
    pixels = decode(result.encoded)
    assert pixels.dtype == np.uint8
    assert pixels.shape == (result.height, result.width, 3)
    assert result.format == ("jpeg" if result.encoded[:2] == b"\xff\xd8" else "png")


@pytest.mark.parametrize("name", ["rgb.jpg", "rgb.png", "really-a-png.jpg"])
def test_rgb_jpeg_and_png_keep_their_bytes(name):
    data = images.AWKWARD[name]()
    result = normalize(data)
    assert result.encoded == data and not result.reencoded


def test_a_png_named_jpg_is_recorded_as_png():
    assert normalize(images.rgb_png()).format == "png"


@pytest.mark.parametrize("name", ["cmyk.jpg", "gray.jpg", "deep.png", "gray16.png", "alpha.png",
                                  "palette.gif", "plain.bmp", "scan.tiff", "photo.webp", "rotated.jpg"])
def test_other_kinds_are_reencoded(name):
    assert normalize(images.AWKWARD[name]()).reencoded


def test_sixteen_bit_keeps_the_high_byte():
    expected = images.pixels()
    got = decode(normalize(images.png16()).encoded)
    np.testing.assert_array_equal(got, expected)
    gray = decode(normalize(images.gray16_png()).encoded)
    np.testing.assert_array_equal(gray[..., 0], expected[..., 0])


def test_alpha_is_composited_on_white():
    got = decode(normalize(images.rgba_png()).encoded).astype(int)
    expected = (images.pixels().astype(int) + 255) // 2  # alpha 128 over white
    assert np.abs(got - expected).max() <= 2


def test_exif_rotation_is_applied():
    result = normalize(images.rotated_jpeg())
    assert (result.height, result.width) == (32, 24)  # stored as 24 rows x 32 columns


def test_lossy_sources_stay_jpeg_and_lossless_become_png():
    assert normalize(images.cmyk_jpeg()).format == "jpeg"
    assert normalize(images.webp()).format == "jpeg"
    assert normalize(images.bmp()).format == "png"


def test_max_side_shrinks_only_large_images():
    big = normalize(images.rgb_jpeg(size=(320, 240)), max_side=64)
    assert (big.height, big.width) == (48, 64) and big.reencoded
    assert decode(big.encoded).shape == (48, 64, 3)
    small = normalize(images.rgb_jpeg(), max_side=64)
    assert not small.reencoded


@pytest.fixture
def drafts(monkeypatch):
    """The size each JPEG decodes at after Image.draft: smaller than stored means DCT scaling."""
    sizes, original = [], JpegImageFile.draft

    def draft(self, mode, size):
        result = original(self, mode, size)
        if result is not None:  # None: too late, the image is already decoded
            sizes.append(self.size)
        return result

    monkeypatch.setattr(JpegImageFile, "draft", draft)
    return sizes


@pytest.mark.parametrize("max_side, drafted, stored", [
    (400, (400, 300), (400, 300)),  # 1/4: exactly the limit
    (480, (400, 300), (400, 300)),  # 1/4: within 80% of the limit, kept as decoded
    (600, (800, 600), (600, 450)),  # 1/2, then resized down to the limit
    (1300, (1600, 1200), (1300, 975)),  # no DCT scale covers 80% of it: full size, then resized
])
def test_a_jpeg_beyond_the_limit_is_shrunk_through_dct_scaling(max_side, drafted, stored, drafts):
    data = images.photo_jpeg(1600, 1200)
    result = normalize(data, max_side=max_side)
    assert drafts == [drafted]  # the size libjpeg decoded at: the smallest DCT scale covering 80% of the limit
    assert (result.width, result.height) == stored and result.reencoded
    shrunk = decode(result.encoded).astype(int)
    direct = np.asarray(Image.open(io.BytesIO(data)).resize((result.width, result.height), Image.BICUBIC))
    assert np.abs(shrunk - direct).mean() < 3


def test_within_the_limit_the_original_bytes_are_kept(drafts):
    data = images.photo_jpeg(640, 480)
    for max_side in (640, 2048, 0, None):
        result = normalize(data, max_side=max_side)
        assert result.encoded == data and not result.reencoded and (result.width, result.height) == (640, 480)
    assert drafts == [(80, 60)] * 4  # verification only: every coefficient read, at 1/8 scale


def test_a_panorama_shrinks_as_much_as_a_photo(drafts):
    result = normalize(images.photo_jpeg(2400, 600), max_side=600)
    assert (result.width, result.height) == (600, 150) and drafts == [(600, 150)]


def test_an_image_over_the_pixel_cap_is_rejected_from_its_header():
    with pytest.raises(Rejected) as caught:
        normalize(images.png_declaring(13000, 13000), max_pixels=50_000_000)
    # From the header alone: decoding the few bytes of pixel data would have said "truncated".
    assert str(caught.value).startswith("too many pixels to decode safely: 13000x13000 is 169 MP")
    huge = images.encode(Image.new("1", (3000, 2000)), "PNG")  # a real 6 MP image in a few KB
    with pytest.raises(Rejected, match="3000x2000 is 6 MP, more than the limit of 5 MP"):
        normalize(huge, max_pixels=5_000_000)
    assert normalize(huge, max_pixels=6_000_000).width == 3000


@pytest.mark.parametrize("name, reason", [
    ("empty.jpg", "empty file"),
    ("truncated.jpg", "truncated or corrupt JPEG"),
    ("truncated.png", "truncated or corrupt PNG"),
    ("text.jpg", "not an image"),
])
def test_broken_files_are_rejected_with_a_reason(name, reason):
    with pytest.raises(Rejected) as caught:
        normalize(images.BROKEN[name]())
    assert reason in str(caught.value)
    assert repr(caught.value) == str(caught.value)  # the dead-letter reason Beam records
