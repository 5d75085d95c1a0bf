"""The bucket of a simulated year: the files a night brings, and SOURCE, the way the nightly run reads them.

The pictures are scikit-learn's digits drawn as `stoke demo` draws them (benchmarks/month.py). A fixed
held-out set (the same for every seed) never reaches the bucket; the rest arrive, each original once,
then shifted by a pixel or two (another picture of the same digit) when a class runs out. The bucket
keeps a record of every file it holds: its class folder, the digit it shows, whether it is readable and
what it is (an arrival, a near-copy, a broken file...), so the invariants know what each file should
have become.

SOURCE is the bucket folder itself, or, when the year carries a secret, a CSV manifest of the bucket
served over HTTP on 127.0.0.1 behind basic auth (the password in SOURCE's user info) or behind a
query signature on the manifest's URL. The server can be told to answer errors for a while (a store
having a bad minute).
"""
from __future__ import annotations

import base64
import csv
import dataclasses
import functools
import hashlib
import http.server
import io
import os
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.month import Digit, digits, split
from benchmarks.year_schedule import NAMES, Event

HELD_OUT_PER_CLASS = 30
HELD_OUT_SEED = 0  # the same held-out set for every seed: a reference that never drifts
SIZE = 32
USER = "alice"


@dataclasses.dataclass
class File:
    path: str  # below the bucket folder: <class folder>/<name>
    folder: str  # the class it is filed under
    shows: str | None  # the digit it shows (None: no picture at all)
    readable: bool
    kind: str  # arrival, near_copy, reupload, relabelled, rewritten, broken:<how>, odd:<how>
    night: int  # the night it was last written
    sha256: str
    size: int
    mtime: float


class Pictures:
    """The digits: the held-out set, and new pictures of a class for as long as the year asks."""

    def __init__(self, seed: int):
        from sklearn.datasets import load_digits

        self.pixels = load_digits().images
        self.held_out, rest = split(digits(SIZE), HELD_OUT_PER_CLASS, HELD_OUT_SEED)
        order = np.random.default_rng([seed, 0, 1]).permutation(len(rest))
        self.pool = {name: [rest[i] for i in order if rest[i].label == name] for name in NAMES}
        self.used = dict.fromkeys(NAMES, 0)
        self.rng = np.random.default_rng([seed, 0, 2])

    def take(self, label: str) -> bytes:
        """A picture of `label` the bucket has not had: an original while they last, then one shifted."""
        pool, used = self.pool[label], self.used[label]
        self.used[label] += 1
        digit = pool[used % len(pool)]
        if used < len(pool):
            return digit.png
        dx, dy = (int(v) for v in self.rng.choice([-2, -1, 1, 2], 2))
        return render(np.roll(self.pixels[digit.index] * 1.0, (dy, dx), axis=(0, 1)), SIZE)

    def held_out_digits(self) -> list[Digit]:
        return self.held_out


def render(pixels: np.ndarray, size: int, mode: str = "RGB") -> bytes:
    """An 8x8 scan (values 0-16) as `stoke demo` draws it, in `mode`."""
    grey = np.clip(pixels * (255 / 16), 0, 255).astype(np.uint8)
    image = Image.fromarray(grey, "L").resize((size, size), Image.BILINEAR)
    return encode(image.convert("RGB"), mode)


def encode(image: Image.Image, mode: str, format: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    converted = image.convert(mode) if mode not in ("I;16", "RGBA") else image
    if mode == "I;16":  # 16-bit grey: the 8-bit levels scaled up
        converted = Image.fromarray((np.asarray(image.convert("L"), dtype=np.uint16) * 257), "I;16")
    if mode == "RGBA":
        converted = image.convert("RGB")
        converted.putalpha(255)
    converted.save(buffer, format=format)
    return buffer.getvalue()


def huge_header_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A small PNG whose header declares a picture of width x height (10 gigapixels by default)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


class Bucket:
    """The bucket folder and the record of every file in it."""

    def __init__(self, site: Path, seed: int):
        self.site = site
        self.folder = site / "bucket"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pictures = Pictures(seed)
        self.files: dict[str, File] = {}
        self.serial = 0
        self.rng = np.random.default_rng([seed, 0, 3])

    # ------------------------------------------------------------ writing

    def write(self, folder: str, name: str, data: bytes, night: int, *, shows: str | None, readable: bool,
              kind: str) -> File:
        path = f"{folder}/{name}"
        target = self.folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        stat = target.stat()
        record = File(path, folder, shows, readable, kind, night, hashlib.sha256(data).hexdigest(), len(data),
                      stat.st_mtime)
        self.files[path] = record
        return record

    def name(self, night: int, suffix: str = ".png") -> str:
        self.serial += 1
        return f"n{night:04d}-{self.serial:05d}{suffix}"

    def arrive(self, night: int, label: str, count: int, folder: str | None = None, kind: str = "arrival") -> int:
        for _ in range(count):
            self.write(folder or label, self.name(night), self.pictures.take(label), night, shows=label,
                       readable=True, kind=kind)
        return count

    def readable(self, kinds: tuple[str, ...] = ("arrival", "rewritten")) -> list[File]:
        return sorted((f for f in self.files.values() if f.readable and f.kind in kinds), key=lambda f: f.path)

    # ------------------------------------------------------------ a night's events

    def apply(self, night: int, event: Event, classes: list[str], rng) -> str:
        """Applies an arrival or extra event to the bucket; returns what it did, in a few words."""
        kind, p = event.kind, event.params
        if kind == "all":
            return f"{sum(self.arrive(night, c, p['per_class']) for c in classes)} digits of {len(classes)} classes"
        if kind == "one":
            label = str(rng.choice(classes))
            return f"{self.arrive(night, label, p['count'])} digits of {label} only"
        if kind == "none":
            return "nothing"
        if kind == "skewed":
            few = [str(c) for c in rng.choice(classes, min(p["classes"], len(classes)), replace=False)]
            weights = rng.dirichlet(np.ones(len(few)) * 0.7)
            counts = np.maximum(1, np.round(weights * p["count"])).astype(int)
            return ", ".join(f"{self.arrive(night, c, int(n))} {c}" for c, n in zip(few, counts))
        if kind == "new_class":  # applied by the world, which knows the withheld class (see arrive_new)
            raise ValueError("new_class is applied by the world")
        if kind == "near_copies":
            return self._near_copies(night, p["count"], rng)
        if kind == "reuploads":
            picked = self._pick(rng, p["count"])
            for f in picked:
                self.write(f.folder, self.name(night), (self.folder / f.path).read_bytes(), night, shows=f.shows,
                           readable=True, kind="reupload")
            return f"{len(picked)} exact copies under new names"
        if kind == "broken":
            return self._broken(night, p["files"], classes, rng)
        if kind == "odd":
            return self._odd(night, p["files"], classes, rng)
        if kind == "relabelled":
            return f"{self.arrive(night, p['from'], p['count'], folder=p['to'], kind='relabelled')} {p['from']} " \
                   f"filed under {p['to']}"
        if kind == "rewritten":
            picked = self._pick(rng, p["count"])
            for f in picked:
                self.write(f.folder, f.path.split("/", 1)[1], self.pictures.take(f.shows), night, shows=f.shows,
                           readable=True, kind="rewritten")
            return f"{len(picked)} rewritten in place: {', '.join(f.path for f in picked[:3])}"
        if kind == "deleted":
            picked = self._pick(rng, p["count"], kinds=("arrival", "rewritten", "near_copy", "reupload", "odd",
                                                        "relabelled"))
            for f in picked:
                (self.folder / f.path).unlink()
                del self.files[f.path]
            return f"{len(picked)} deleted: {', '.join(f.path for f in picked[:3])}"
        raise ValueError(f"not a bucket event: {kind}")

    def _pick(self, rng, count: int, kinds: tuple[str, ...] = ("arrival", "rewritten")) -> list[File]:
        candidates = self.readable(kinds)
        if not candidates:
            return []
        chosen = rng.choice(len(candidates), min(count, len(candidates)), replace=False)
        return [candidates[i] for i in sorted(chosen)]

    def _near_copies(self, night: int, count: int, rng) -> str:
        picked = self._pick(rng, count)
        for f in picked:
            image = Image.open(self.folder / f.path).convert("RGB")
            pixels = np.clip(np.asarray(image, dtype=np.int16) + int(rng.integers(2, 6)), 0, 255).astype(np.uint8)
            self.write(f.folder, self.name(night), encode(Image.fromarray(pixels), "RGB"), night, shows=f.shows,
                       readable=True, kind="near_copy")
        return f"{len(picked)} near-copies (a little brighter)"

    def _broken(self, night: int, how: list[str], classes: list[str], rng) -> str:
        folder = str(rng.choice(classes))
        sample = self.pictures.take(folder)
        data = {"truncated": sample[: len(sample) // 2], "text": b"not an image at all\n", "empty": b"",
                "huge_header": huge_header_png()}
        for kind in how:
            self.write(folder, self.name(night), data[kind], night, shows=None, readable=False, kind=f"broken:{kind}")
        return f"{', '.join(how)} in {folder}"

    def _odd(self, night: int, how: list[str], classes: list[str], rng) -> str:
        done = []
        for kind in how:
            label = str(rng.choice(classes))
            image = Image.open(io.BytesIO(self.pictures.take(label))).convert("RGB")
            name, data = self.name(night), encode(image, "RGB")
            if kind == "cmyk":
                name, data = self.name(night, ".jpg"), encode(image, "CMYK", "JPEG")
            elif kind == "sixteen_bit":
                data = encode(image, "I;16")
            elif kind == "alpha":
                data = encode(image, "RGBA")
            elif kind == "palette":
                data = encode(image, "P")
            elif kind == "space_name":
                name = f"a digit {self.name(night)}"
            elif kind == "unicode_name":
                name = f"数字 ü-{self.name(night)}"
            self.write(label, name, data, night, shows=label, readable=True, kind=f"odd:{kind}")
            done.append(f"{kind} in {label}")
        return ", ".join(done)

    # ------------------------------------------------------------ what the bucket holds

    def manifest(self) -> Path:
        """Writes SITE/manifest.csv, every file of the bucket as a row `bucket/<folder>/<name>,<folder>`."""
        path = self.site / "manifest.csv"
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["uri", "label"])
        for f in sorted(self.files.values(), key=lambda f: f.path):
            writer.writerow([f"bucket/{f.path}", f.folder])
        path.write_text(buffer.getvalue())
        return path


# ---------------------------------------------------------------- SOURCE, and the server behind it


@dataclasses.dataclass
class Secret:
    """How SOURCE carries its credential, and the strings no file, database or log line may hold."""

    kind: str
    password: str | None = None  # as the server is sent it
    in_url: str | None = None  # as written in SOURCE's user info
    query: str | None = None  # the manifest URL's query
    needles: tuple[bytes, ...] = ()


def secret_for(kind: str, seed: int) -> Secret:
    token = f"Yr{seed}Zq7sekrit"  # in every spelling, so a search for it finds any leak
    if kind == "none":
        return Secret(kind)
    if kind in ("password", "digits_password", "odd_password"):
        password = {"password": f"{token}Pw", "digits_password": f"2024;{token}",
                    "odd_password": f"pa\"s's {token}@:@x"}[kind]
        in_url = password.replace("@:@", "@:%40")
        basic = base64.b64encode(f"{USER}:{password}".encode())
        return Secret(kind, password=password, in_url=in_url, needles=(token.encode(), basic))
    query = {"amz_signature": "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAYEAR/20260101/us-east-1/s3/"
                              f"aws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-Signature={token}",
             "hmac_query": f"hmac={token}"}[kind]
    return Secret(kind, query=query, needles=(token.encode(),))


class Site:
    """A web server on 127.0.0.1 serving the site folder (the bucket and its manifest) to SOURCE's
    credentials, on a thread; `errors(seconds, share)` makes it answer 503 to a share of requests for a while."""

    def __init__(self, folder: Path, secret: Secret, seed: int):
        self.secret, self.rng = secret, np.random.default_rng([seed, 0, 4])
        self.failing_until, self.share, self.lock = 0.0, 0.0, threading.Lock()
        self.answered = {"ok": 0, "refused": 0, "errors": 0}
        handler = functools.partial(type("Handler", (_Handler,), {"site": self}), directory=str(folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def source(self) -> str:
        host = f"127.0.0.1:{self.port}"
        if self.secret.in_url is not None:
            return f"http://{USER}:{self.secret.in_url}@{host}/manifest.csv"
        return f"http://{host}/manifest.csv?{self.secret.query}"

    def errors(self, seconds: float, share: float) -> None:
        with self.lock:
            self.failing_until, self.share = time.monotonic() + seconds, share

    def failing(self) -> bool:
        with self.lock:
            return time.monotonic() < self.failing_until and self.rng.random() < self.share

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class _Handler(http.server.SimpleHTTPRequestHandler):
    site: Site

    def do_GET(self):
        if self._allowed():
            super().do_GET()

    def do_HEAD(self):
        if self._allowed():
            super().do_HEAD()

    def _allowed(self) -> bool:
        secret = self.site.secret
        if self.site.failing():
            return self._answer(503, "errors")
        if secret.password is not None:
            expected = "Basic " + base64.b64encode(f"{USER}:{secret.password}".encode()).decode()
            if self.headers.get("Authorization") != expected:
                return self._answer(401, "refused")
        elif self.path.split("?")[0].endswith("manifest.csv") and self.path != f"/manifest.csv?{secret.query}":
            return self._answer(403, "refused")
        self.site.answered["ok"] += 1
        return True

    def _answer(self, code: int, tally: str) -> bool:
        self.site.answered[tally] += 1
        self.send_response(code)
        if code == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="bucket"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def log_message(self, *args):
        pass


def folder_source(bucket: Bucket) -> str:
    return os.fspath(bucket.folder)
