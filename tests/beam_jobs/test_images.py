import numpy as np
import pytest
import tensorflow as tf

from beam_jobs.images import Rejected, normalize
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
