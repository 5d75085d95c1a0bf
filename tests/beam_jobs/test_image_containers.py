"""Containers and headers that hide a huge image: refused from the header, nothing decoded."""
from __future__ import annotations

import pytest
from PIL import Image, ImageFile

from components.common.images import Rejected, normalize
from tests.beam_jobs import images

LIMIT = 5_000_000  # 5 MP: the 6 MP images below are over it


@pytest.fixture
def no_decoding(monkeypatch):
    """Call it once the test's files are made: from then on, decoding any pixel fails the test
    (refusals must come from headers alone)."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("decoded pixels before refusing")

    def arm():
        Image.init()  # registering Pillow's plugins builds a few images in memory: not a file's pixels
        monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    return arm


@pytest.mark.parametrize("inner", ["png", "bmp"])
@pytest.mark.parametrize("kind", [1, 2], ids=["ico", "cur"])
def test_an_icon_hiding_a_large_image_is_refused_unread(no_decoding, kind, inner):
    hidden = images.sparse_png(3000, 2000) if inner == "png" else images.encode(Image.new("1", (3000, 2000)), "BMP")
    data = images.icon(hidden, kind)
    no_decoding()
    with pytest.raises(Rejected, match=r"not an image: (ICO|CUR) files are not accepted"):
        normalize(data, max_pixels=LIMIT)


def test_a_small_icon_is_refused_too_whatever_its_name():
    # The format is refused, not the size: an .png name or a harmless inner image changes nothing.
    with pytest.raises(Rejected, match="ICO files are not accepted"):
        normalize(images.icon(images.rgb_png()))


def test_other_formats_pillow_knows_are_refused():
    for fmt in ("ICNS", "PPM", "PCX"):
        data = images.encode(Image.new("RGB", (32, 32)), fmt)
        with pytest.raises(Rejected, match=f"{fmt} files are not accepted"):
            normalize(data)


@pytest.mark.parametrize("make", [
    lambda: images.jpeg_declaring(3000, 2000),
    lambda: images.png_declaring(3000, 2000),
    lambda: images.gif_wider_than_its_screen(3000, 2000),
], ids=["jpeg", "png", "gif-frame-beyond-screen"])
def test_headers_declaring_too_many_pixels_are_refused_unread(no_decoding, make):
    data = make()
    no_decoding()
    with pytest.raises(Rejected, match="3000x2000 is 6 MP, more than the limit of 5 MP"):
        normalize(data, max_pixels=LIMIT)


def test_pillows_own_bomb_limit_reads_as_a_pixel_refusal():
    with pytest.raises(Rejected, match="too many pixels to decode safely"):
        normalize(images.jpeg_declaring(60000, 60000), max_pixels=LIMIT)


@pytest.mark.parametrize("fmt", ["TIFF", "MPO", "GIF"])
def test_only_the_first_frame_of_a_multi_frame_file_is_decoded(fmt):
    data = images.with_a_huge_second_frame(fmt, 3000, 2000)
    record = normalize(data, max_pixels=LIMIT)
    assert (record.width, record.height) == (32, 24)


def test_an_animated_png_declares_its_largest_frame_in_its_header(no_decoding):
    # APNG frames must fit inside IHDR (and WebP frames inside the canvas): the header covers them.
    data = images.with_a_huge_second_frame("PNG", 3000, 2000)
    no_decoding()
    with pytest.raises(Rejected, match="3000x2000 is 6 MP"):
        normalize(data, max_pixels=LIMIT)
