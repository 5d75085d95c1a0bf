"""Verify and normalize one image so that `tf.io.decode_image` turns it into 8-bit RGB.

RGB JPEG and 8-bit RGB PNG keep their original bytes: re-encoding would cost time and, for JPEG,
quality. Everything else (CMYK, grayscale, palette, alpha, 16-bit, GIF, BMP, TIFF, WebP, an EXIF
rotation) is decoded once here and re-encoded: JPEG (quality 95) when the source was lossy, PNG
otherwise. Every failure becomes `Rejected`, whose message is the dead-letter reason.

With a size limit, a larger image is shrunk here, once, instead of on every epoch: a JPEG decodes
at the smallest DCT scale (1/2, 1/4, 1/8) that still covers 80% of the limit, so libjpeg skips
most of the inverse DCT, and a resize takes it the rest of the way when it is still too large.
A pixel cap, checked against the header before any pixel is decoded, keeps a small file that
declares a huge image (a decompression bomb) from taking gigabytes and seconds of CPU; containers
that hide their image's size (ICO, CUR) are refused (components/common/image_header.py).
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from components.common.image_header import ImageRefused, open_image
from components.common.quality_scores import SIDE
from components.common.signatures import Pixels, pixels_of

LOSSY = frozenset({"JPEG", "MPO", "WEBP"})
ORIENTATION = 0x0112  # EXIF tag; TensorFlow's decoders ignore it, so rotated photos are re-encoded
PNG_RGB8 = (8, 2)  # IHDR bit depth and colour type of plain 8-bit truecolour
SHORTFALL = 0.8  # a JPEG shrunk by DCT scaling alone may end this far below the size limit


class Rejected(Exception):
    """A source that cannot become a training record; its message is the reason."""

    def __repr__(self) -> str:
        # Beam's dead-letter output carries repr(exception): make that the plain reason.
        return str(self)


@dataclass(frozen=True)
class Limits:
    """What ingest accepts and keeps: 0 or None means no limit."""

    max_side: int | None = None  # longer side kept; larger images are shrunk
    max_pixels: int | None = None  # larger images are rejected before decoding
    max_bytes: int | None = None  # larger files are rejected before reading
    blank_std: float = 0.0  # images whose grey level varies less are rejected as blank; 0: none are


@dataclass(frozen=True)
class Normalized:
    encoded: bytes
    format: str  # "jpeg" or "png"
    height: int
    width: int
    reencoded: bool
    pixels: Pixels | None = None  # dHashes, grey mean and std, quality scores: from the decode done here


def normalize(data: bytes, max_side: int | None = None, max_pixels: int | None = None) -> Normalized:
    """Checks that `data` is a whole image and returns bytes that decode to 8-bit RGB, with the
    longer side at most `max_side` (None or 0: as large as it came)."""
    if not data:
        raise Rejected("empty file")
    kind = "image"
    try:
        image = open_image(data, max_pixels)  # formats and pixels from the header, before decoding
        kind = image.format
        width, height = image.size
        oversize = bool(max_side) and max(width, height) > max_side
        if _decodes_to_rgb8(data, image) and not oversize:
            _verify(image)
            return Normalized(data, "jpeg" if kind in ("JPEG", "MPO") else "png", height, width, False,
                              pixels_of(image))
        pixels = _to_rgb(image, max_side)
    except Rejected:
        raise
    except ImageRefused as refused:
        raise Rejected(str(refused)) from None
    except Image.DecompressionBombError as error:
        raise Rejected(f"too large to decode safely: {error}") from None
    except Exception as error:  # PIL raises many types for damaged files; all mean the same here.
        raise Rejected(f"truncated or corrupt {kind}: {error}") from None
    return _encode(pixels, lossy=kind in LOSSY)


def _decodes_to_rgb8(data: bytes, image: Image.Image) -> bool:
    if image.getexif().get(ORIENTATION, 1) != 1:
        return False
    if image.format in ("JPEG", "MPO"):
        return image.mode == "RGB"
    if image.format == "PNG":
        return image.mode == "RGB" and tuple(data[24:26]) == PNG_RGB8 and "transparency" not in image.info
    return False


def _verify(image: Image.Image) -> None:
    """Decodes the whole file; JPEG at a DCT scale (1/8 at most), which still reads every coefficient
    but skips most of the inverse DCT, so a truncated file is caught at a fraction of the cost. The
    scale leaves the longer side at least the 64 px the quality scores read (components/common/quality_scores.py)."""
    if image.format in ("JPEG", "MPO"):
        ratio = max(1 / 8, min(1.0, SIDE / max(image.size)))
        image.draft("RGB", (max(1, math.ceil(image.width * ratio)), max(1, math.ceil(image.height * ratio))))
    image.load()


def _to_rgb(image: Image.Image, max_side: int | None) -> Image.Image:
    if max_side and image.format in ("JPEG", "MPO"):
        # draft() picks the largest DCT scale that still covers the size asked for, at the image's
        # own aspect ratio (so a panorama shrinks as much as a 4:3 photo). Asking for SHORTFALL of
        # the limit lets a 2000 px photo decode at 1/4 to 500 px, kept as it is, instead of at 1/2
        # to 1000 px and resized: a photo is then stored at 80-100% of the limit, for the CPU that
        # verifying it at full size costs.
        scale = SHORTFALL * max_side / max(image.size)
        image.draft("RGB", (math.ceil(image.width * scale), math.ceil(image.height * scale)))
    image.load()
    if image.getexif().get(ORIENTATION, 1) != 1:
        image = ImageOps.exif_transpose(image)  # a copy even when there is nothing to turn: only when needed
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit grayscale: PIL's convert() would clip at 255; keep the high byte instead.
        image = Image.fromarray((np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8), "L")
    elif image.mode == "F":
        image = Image.fromarray(np.clip(np.asarray(image), 0, 255).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    if image.mode != "RGB":
        image = image.convert("RGB")
    if max_side and max(image.size) > max_side:
        # After DCT scaling the resize shrinks by less than 2x, where bilinear (antialiased in PIL,
        # like every PIL filter) loses little to bicubic or Lanczos at half and a third of the CPU.
        image.thumbnail((max_side, max_side), Image.BILINEAR)
    return image


def _encode(image: Image.Image, lossy: bool) -> Normalized:
    buffer = io.BytesIO()
    if lossy:
        image.save(buffer, format="JPEG", quality=95)
    else:
        image.save(buffer, format="PNG")
    return Normalized(buffer.getvalue(), "jpeg" if lossy else "png", image.height, image.width, True,
                      pixels_of(image))
