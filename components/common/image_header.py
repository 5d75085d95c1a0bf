"""Opening an untrusted image by its header only: the formats Stoke accepts and a pixel cap, checked
before any pixel is decoded, for ingest (components/common/images.py) and `stoke predict` alike.

Only the formats the record contract needs are opened: JPEG (and MPO, a JPEG with more frames), PNG
(and APNG), GIF, BMP, TIFF and WebP, the formats ingest lists by extension. Every other format Pillow
knows is refused, whatever the file is called, above all the containers whose header does not say
the size of what they hold: an ICO or CUR directory entry says 256x256 while the PNG or BMP it
embeds may be 12000x12000, decoded in full on load (ICNS, DDS, PSD, FLI and the like are no better,
and nothing Stoke trains on arrives in them).

Of the accepted formats only the first frame is ever decoded (by ingest and by predict's check;
TensorFlow's decoders read the first frame too), and its size is in the header Pillow reads on open:
a JPEG's SOF (for MPO, the first picture's), PNG's IHDR (APNG frames must fit inside it), a GIF's
screen widened to its first frame, the first TIFF page's tags and a WebP canvas. Later TIFF pages and
MPO pictures, however large, are never decoded.
"""
from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

ACCEPTED = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")  # Pillow's JPEG opener returns MPO files too

# Pillow warns past 89 MP and raises past 178 MP on open; the cap here says it in Stoke's words.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)


class ImageRefused(ValueError):
    """An image refused from its header; the message says why."""


def open_image(data: bytes, max_pixels: int | None) -> Image.Image:
    """`data` opened lazily as one of the accepted formats, with at most `max_pixels` (None or 0:
    any number) in the frame that loading decodes. Raises ImageRefused before decoding a pixel."""
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED)
    except UnidentifiedImageError:
        raise ImageRefused(f"not an image: {_kind(data)}") from None
    except Image.DecompressionBombError as error:
        raise ImageRefused(f"too many pixels to decode safely: {error}") from None
    width, height = image.size
    if max_pixels and width * height > max_pixels:
        raise ImageRefused(f"too many pixels to decode safely: {width}x{height} is {width * height / 1e6:,.0f} MP, "
                           f"more than the limit of {max_pixels / 1e6:g} MP (ingest.max_megapixels)")
    return image


def _kind(data: bytes) -> str:
    """Why a file is not accepted: the name of the format its first bytes match, when Pillow knows
    one (by each format's signature test alone: Pillow's ICO opener decodes on open), else that no
    format matched."""
    Image.init()
    prefix = data[:16]
    found = next((name for name, (_, accept) in Image.OPEN.items() if accept and _matches(accept, prefix)), None)
    if found is None:
        return "no known image format in the file"
    return f"{found} files are not accepted (only {', '.join(ACCEPTED)}: a container such as ICO can hide " \
           "a far larger image than its header says)"


def _matches(accept, prefix: bytes) -> bool:
    try:
        return bool(accept(prefix))
    except Exception:  # a signature test that cannot read this prefix did not match
        return False
