"""Small real image files, awkward and broken, made by the tests."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def pixels(height=24, width=32, seed=0) -> np.ndarray:
    """A smooth gradient with some noise: compresses like a photo, not like a flat colour."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) * 4 % 256], -1)
    return np.clip(rgb + rng.integers(-8, 8, rgb.shape), 0, 255).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def rgb_jpeg(seed=0, size=(32, 24)) -> bytes:
    return encode(Image.fromarray(pixels(size[1], size[0], seed)), "JPEG", quality=90)


def rgb_png(seed=0) -> bytes:
    return encode(Image.fromarray(pixels(seed=seed)), "PNG")


def cmyk_jpeg() -> bytes:
    return encode(Image.fromarray(pixels()).convert("CMYK"), "JPEG")


def gray_jpeg() -> bytes:
    return encode(Image.fromarray(pixels()).convert("L"), "JPEG")


def png16() -> bytes:
    """16-bit RGB PNG: PIL reads only 8 bits of it, so write the PNG chunks by hand."""
    import struct
    import zlib

    data = pixels().astype(">u2") * 257
    rows = b"".join(b"\x00" + row.tobytes() for row in data)
    height, width = data.shape[:2]

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def gray16_png() -> bytes:
    return encode(Image.fromarray((pixels()[..., 0].astype(np.uint16) * 257), "I;16"), "PNG")


def rgba_png() -> bytes:
    rgba = np.dstack([pixels(), np.full(pixels().shape[:2], 128, np.uint8)])
    return encode(Image.fromarray(rgba, "RGBA"), "PNG")


def palette_gif() -> bytes:
    return encode(Image.fromarray(pixels()).convert("P"), "GIF")


def bmp() -> bytes:
    return encode(Image.fromarray(pixels()), "BMP")


def tiff() -> bytes:
    return encode(Image.fromarray(pixels()), "TIFF")


def webp() -> bytes:
    return encode(Image.fromarray(pixels()), "WEBP")


def rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when shown
    return encode(Image.fromarray(pixels()), "JPEG", exif=exif)


def photo_jpeg(width: int, height: int) -> bytes:
    """A smooth photo-like JPEG: gradients a resize keeps, so shrunk copies can be compared."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = [np.sin(x / width * 6.3), np.cos(y / height * 4.0), np.sin((x + y) / (width + height) * 9.0)]
    return encode(Image.fromarray(((np.stack(channels, -1) + 1) * 127).astype(np.uint8)), "JPEG", quality=90)


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height over a few bytes of pixel data: how a
    decompression bomb looks before its pixels are inflated."""
    data = bytearray(rgb_png())
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR's CRC covers type and data
    return bytes(data)


def truncated_jpeg() -> bytes:
    data = rgb_jpeg(size=(64, 48))
    return data[: len(data) // 2]


def truncated_png() -> bytes:
    data = rgb_png()
    return data[: len(data) // 2]


def not_an_image() -> bytes:
    return b"this is a text file pretending to be a picture\n" * 4


# name -> (bytes, kept as is?) for the valid ones; broken ones have no second value.
AWKWARD = {
    "rgb.jpg": rgb_jpeg,
    "rgb.png": rgb_png,
    "cmyk.jpg": cmyk_jpeg,
    "gray.jpg": gray_jpeg,
    "deep.png": png16,
    "gray16.png": gray16_png,
    "alpha.png": rgba_png,
    "palette.gif": palette_gif,
    "plain.bmp": bmp,
    "scan.tiff": tiff,
    "photo.webp": webp,
    "rotated.jpg": rotated_jpeg,
    "really-a-png.jpg": rgb_png,
    "ünïcödé 画像.jpg": rgb_jpeg,
}
BROKEN = {
    "empty.jpg": lambda: b"",
    "truncated.jpg": truncated_jpeg,
    "truncated.png": truncated_png,
    "text.jpg": not_an_image,
}


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose SOF header declares width x height."""
    data = bytearray(rgb_jpeg())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def icon(inner: bytes, kind: int = 1) -> bytes:
    """An ICO (kind 1) or CUR (kind 2) whose one directory entry says 256x256 and embeds `inner`
    (a PNG or a BMP) as it is: the header says nothing of the inner image's size."""
    header = struct.pack("<HHH", 0, kind, 1)
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(inner), 6 + 16)
    return header + entry + inner


def sparse_png(width: int, height: int) -> bytes:
    """A real, whole 1-bit PNG of width x height: a few KB that decode to width x height pixels."""
    return encode(Image.new("1", (width, height)), "PNG")


def gif_wider_than_its_screen(width: int, height: int) -> bytes:
    """A GIF whose logical screen says 16x16 and whose first frame is width x height."""
    data = bytearray(encode(Image.new("P", (width, height)), "GIF"))
    data[6:10] = struct.pack("<HH", 16, 16)
    return bytes(data)


def with_a_huge_second_frame(fmt: str, width: int, height: int) -> bytes:
    """A small first frame (TIFF page, MPO picture, GIF/WebP/APNG frame) and a huge second one."""
    mode = "RGB" if fmt in ("MPO", "WEBP", "PNG") else "1"
    first = Image.fromarray(pixels(24, 32))
    return encode(first, fmt, save_all=True, append_images=[Image.new(mode, (width, height))])


def photo_crops(count: int, width: int = 320, height: int = 240) -> list[Image.Image]:
    """`count` different photographs: crops of those scikit-image and scikit-learn ship, with a little noise."""
    from benchmarks.jpeg_spans import packaged_photos

    rng, photos, made = np.random.default_rng(0), packaged_photos(), []
    for i in range(count):
        photo = photos[i % len(photos)]
        top = (i // len(photos)) * height % max(1, photo.shape[0] - height)
        crop = photo[top:top + height, :width].astype(np.float32) + rng.normal(0, 3, (height, width, 3))
        made.append(Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)))
    return made


def stored_sideways(picture: Image.Image) -> bytes:
    """The picture as a phone stores it: pixels turned a quarter, EXIF orientation 6 to turn them back."""
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise
    return encode(picture.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=90, exif=exif)


def near_copies(picture: Image.Image) -> dict[str, bytes]:
    """What a picture becomes on its way back into a bucket: re-encoded, resized, cropped, rotated, mirrored."""
    width, height = picture.size
    return {
        "q95": encode(picture, "JPEG", quality=95),
        "q40": encode(picture, "JPEG", quality=40),
        "half": encode(picture.resize((width // 2, height // 2), Image.BILINEAR), "JPEG", quality=90),
        "crop": encode(picture.crop((width // 40, height // 40, width - width // 40, height - height // 40)), "PNG"),
        "sideways": stored_sideways(picture),
        "mirror": encode(picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT), "JPEG", quality=90),
    }


def camera_frames(count: int, width: int = 320, height: int = 240) -> list[Image.Image]:
    """A fixed camera's frames that dHash's 9x8 thumbnail cannot tell apart: the same horizontal gradient,
    each frame in another colour (levels 60 apart or more in some channel), with sensor noise."""
    rng = np.random.default_rng(0)
    levels = np.array([40, 100, 160, 220, 255])
    colours = np.stack(np.meshgrid(levels, levels, levels), -1).reshape(-1, 3)[rng.permutation(len(levels) ** 3)]
    ramp = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    return [Image.fromarray(np.clip(ramp * colours[i % len(colours)] + rng.normal(0, 6, (height, width, 3)), 0, 255)
                            .astype(np.uint8)) for i in range(count)]


def conveyor_frames(count: int, width: int = 320, height: int = 240) -> list[Image.Image]:
    """A camera over a conveyor: the same belt in every frame, and on it another product (a 100 px crop of
    a packaged photo) at another place, with sensor noise."""
    from benchmarks.jpeg_spans import packaged_photos

    rng, photos = np.random.default_rng(1), packaged_photos()
    belt = np.asarray(Image.fromarray(photos[1][:height, :width]).convert("L"), np.float32)[..., None] * 0.3 + 150
    frames = []
    for i in range(count):
        photo, side = photos[i % len(photos)], 100
        top, left = rng.integers(0, photo.shape[0] - side), rng.integers(0, photo.shape[1] - side)
        frame = np.repeat(belt, 3, axis=2)
        y, x = rng.integers(20, height - side - 20), rng.integers(20, width - side - 20)
        frame[y:y + side, x:x + side] = photo[top:top + side, left:left + side]
        frames.append(Image.fromarray(np.clip(frame + rng.normal(0, 4, frame.shape), 0, 255).astype(np.uint8)))
    return frames


def _road(width: int, height: int) -> np.ndarray:
    """What a fixed camera always sees: a horizontal gradient, warmer to the right."""
    ramp = np.linspace(40, 220, width, dtype=np.float32)[None, :, None] * np.array([1.0, 0.9, 0.7], np.float32)
    return np.repeat(ramp, height, axis=0)


def passing_frames(count: int, width: int = 160, height: int = 120) -> list[Image.Image]:
    """A fixed camera's frames of an object passing by: the same gradient, a red square (side 24 at 160 px) at
    another place on a grid in each, with sensor noise. Distinct pictures, which dHash's 9x8 thumbnail mostly
    cannot tell apart (half of 60 share one dHash, all lie within 8 bits)."""
    rng, side, columns = np.random.default_rng(0), 24 * width // 160, 10
    rows = max(-(-count // columns) - 1, 1)
    frames = []
    for i in range(count):
        frame = _road(width, height)
        x = 4 + (width - side - 8) * (i % columns) // (columns - 1)
        y = 4 + (height - side - 8) * (i // columns) // rows
        frame[y:y + side, x:x + side] = (200, 40, 40)
        frames.append(Image.fromarray(np.clip(frame + rng.normal(0, 4, frame.shape), 0, 255).astype(np.uint8)))
    return frames


def stuck_frames(count: int, width: int = 160, height: int = 120) -> list[Image.Image]:
    """A stuck camera: one frame (the gradient, a blue square in the middle) again and again, each with its own
    sensor noise: other bytes, one picture."""
    rng, side = np.random.default_rng(1), 24 * width // 160
    frame = _road(width, height)
    frame[(height - side) // 2:(height + side) // 2, (width - side) // 2:(width + side) // 2] = (40, 40, 200)
    return [Image.fromarray(np.clip(frame + rng.normal(0, 4, frame.shape), 0, 255).astype(np.uint8))
            for _ in range(count)]
