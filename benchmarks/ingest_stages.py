"""Where ingest's time goes per image, and the whole job beside an earlier commit's and a plain loop.

    python -m benchmarks.ingest_stages stages [--images 2000] [--size 320x240] [--photos] [--sample 300]
    python -m benchmarks.ingest_stages side-by-side --before dad2a31 [--images 6000] [--size 320x240]
                                                    [--photos] [--rounds 2]

`stages` times, in this process and on the same images, each step ingest takes for one image (read,
open the header, decode and verify, normalise and re-encode, the SHA-256, the grey histogram, the
dHashes, the quality scores, the block colours, serialising the tf.Example, framing, compressing, writing; and, per image
of the arrival, the driver's near-copy settling and statistics), then runs the whole job
(`python -m beam_jobs.ingest`) on the same folder: its CPU per image less the stages' sum is what Beam's
DirectRunner and the driver's bookkeeping cost. Printed as ms per image and shares of the job's CPU.

`side-by-side` checks the named commit out in a temporary worktree and runs `python -m beam_jobs.ingest`
of it and of this tree alternately, `--rounds` times each (each with its own PYTHONPATH and working
directory), and between them the plain alternative: one process, tf.io.TFRecordWriter with GZIP, each
image read, decoded at 1/8 scale to verify it (as ingest verified before its data checks) and written
as it came. Prints the raw seconds of every run (wall clock, and each program's own clock, which
excludes starting Python and, for the loop, importing TensorFlow) and the ratios of the medians.
The images are benchmarks/jpeg_spans.py's: synthetic photos (two classes) unless `--photos`, which
makes them from packaged photographs (e.g. `--size 2000x1500`).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from isal import isal_zlib
from PIL import Image

from beam_jobs.shards import LEVEL, WINDOW_BITS
from benchmarks.ingest import stoke_ingest
from benchmarks.jpeg_spans import make_camera_photos, make_photos

REPO = Path(__file__).resolve().parents[1]
MAX_SIDE, MAX_PIXELS = 512, 50_000_000  # ingest's defaults (components/contracts/config.py)


def make_images(folder: Path, count: int, size: str, photos: bool) -> float:
    """The benchmark's JPEGs in two class folders; returns their MB."""
    width, height = (int(v) for v in size.split("x"))
    made = (make_camera_photos if photos else make_photos)(folder, count, width, height, classes=2)
    return sum(path.stat().st_size for path, _ in made) / 1e6


class Clock:
    """CPU seconds per named stage, summed over the images."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, work, *args):
        started = time.process_time()
        result = work(*args)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.process_time() - started
        return result


def one_image(clock: Clock, path: Path, out, source: dict) -> dict:
    """One image through ingest's steps, each timed; returns its signature."""
    from beam_jobs import quality
    from components.common import images, signatures
    from components.common.image_header import open_image
    from components.common.quality_scores import moments, scores_of, thumbnail
    from components.contracts import schema

    data = clock("read", path.read_bytes)
    image = clock("open header", open_image, data, MAX_PIXELS)
    if clock("open header", images._decodes_to_rgb8, data, image) and max(image.size) <= MAX_SIDE:
        clock("decode + verify", images._verify, image)
        encoded, form = data, "jpeg"
    else:
        image = clock("decode + verify", images._to_rgb, image, MAX_SIDE)
        encoded, form = clock("normalise: re-encode", _jpeg, image), "jpeg"
    sha = clock("sha256", signatures.sha256, data)
    grey = clock("grey + histogram", image.convert, "L")
    counts = clock("grey + histogram", lambda: np.asarray(grey.histogram(), dtype=np.float64))
    mean, variance = clock("grey + histogram", moments, counts)
    thumb = clock("dHash + mirror", lambda: np.asarray(grey.resize((9, 8), Image.BILINEAR)))
    dhash, mirror = clock("dHash + mirror", signatures.hashes, thumb)
    small = clock("quality scores", thumbnail, image)
    scores = clock("quality scores", scores_of, image, grey, counts, small)
    blocks = clock("block colours", signatures.blocks, small)
    found = clock("quality issues", quality.issues, scores.as_dict(), image.width, image.height,
                  quality.Rules.of(_defaults()))
    example = clock("serialise tf.Example", lambda: schema.encode_example(
        encoded=encoded, image_format=form, height=image.height, width=image.width, label=source["label_id"],
        text=source["label"], source=source["uri"]))
    framed = clock("frame (CRC32C)", _frame, example)
    packed = clock("compress (ISA-L)", isal_zlib.compress, framed, LEVEL, WINDOW_BITS["gzip"])  # a member a record
    clock("write", out["file"].write, packed)
    clock("write", out["digest"].update, packed)
    return {"uri": source["uri"], "sha256": sha, "dhash": dhash, "mirror": mirror, "mean": float(mean),
            "std": float(np.sqrt(variance)), "label": source["label"], "format": form, "width": image.width,
            "height": image.height, "bytes": len(encoded), "split": source["split"],
            "blocks": base64.b64encode(blocks).decode(),
            **({"issues": sorted(found)} if found else {})}


def _jpeg(image: Image.Image) -> bytes:
    """The re-encode of components/common/images.py's _encode, without the measures it takes (timed apart here)."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def _frame(record: bytes) -> bytes:
    from components.common.tfrecord import frame

    return frame(record)


def _defaults():
    from components.contracts.config import IngestConfig

    return IngestConfig()


def time_stages(files: list[Path], folder: Path) -> tuple[dict, list[dict]]:
    """CPU seconds per stage over `files`, and their signatures."""
    clock = Clock()
    labels = sorted({path.parent.name for path in files})
    out = {"file": open(folder / "stages.tfrecord.gz", "wb"), "digest": hashlib.sha256()}
    signatures = []
    for index, path in enumerate(files):
        source = {"uri": str(path), "label": path.parent.name, "label_id": labels.index(path.parent.name),
                  "split": "eval" if index % 10 == 0 else "train"}
        signatures.append(one_image(clock, path, out, source))
    out["file"].close()
    _driver_stages(clock, signatures, labels)
    return clock.seconds, signatures


def _driver_stages(clock: Clock, signatures: list[dict], labels: list[str]) -> None:
    """What the driver does per record after the job: near-copies among the arrival, statistics."""
    from beam_jobs.near_copies import arrange
    from beam_jobs.near_lookup import NearRules
    from beam_jobs.statistics import statistics as span_statistics

    kept = [dict(s) for s in signatures]
    clock("driver: near-copies of the arrival", arrange, kept, NearRules(mode="follow"), None)
    clock("driver: statistics", lambda: [s.SerializeToString() for s in span_statistics(kept, [], labels).values()])


def stages(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="stoke-bench-stages-") as tmp:
        tmp = Path(tmp)
        megabytes = make_images(tmp / "source", args.images, args.size, args.photos)
        files = sorted((tmp / "source").rglob("*.jpg"))
        sample = files[::max(1, len(files) // args.sample)][:args.sample]
        seconds, _ = time_stages(sample, tmp)
        job = stoke_ingest(tmp / "source", tmp / "root")
        half = stoke_ingest(_half(files, tmp / "half"), tmp / "root-half")
    # The job's CPU per image: the difference between the whole and the half set, so that starting Python and
    # importing Beam, the same for both, drop out.
    job_ms = 1000 * (job["cpu_seconds"] - half["cpu_seconds"]) / (job["images"] - half["images"])
    per_image = {name: 1000 * value / len(sample) for name, value in seconds.items()}
    measured = sum(per_image.values())
    checks = sum(v for k, v in per_image.items() if k in CHECKS)
    rows = {**per_image, "Beam, driver and the rest (job less the stages)": job_ms - measured}
    return {"images": args.images, "size": args.size, "photos": args.photos, "input_mb": round(megabytes, 1),
            "sample": len(sample), "job": job, "job_half": half, "job_cpu_ms_per_image": round(job_ms, 3),
            "checks_ms_per_image": round(checks, 3), "checks_share_of_job_cpu": round(checks / job_ms, 3),
            "ms_per_image": {k: round(v, 3) for k, v in rows.items()},
            "share_of_job_cpu": {k: round(v / job_ms, 3) for k, v in rows.items()}}


# The data checks added to ingest's read-verify-write: content signatures, near-copies, quality, statistics.
CHECKS = ("sha256", "grey + histogram", "dHash + mirror", "quality scores", "block colours", "quality issues",
          "driver: near-copies of the arrival", "driver: statistics")


def _half(files: list[Path], folder: Path) -> Path:
    """Every other file of the set, linked into `folder` in the same class folders."""
    for path in files[::2]:
        target = folder / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, target)
    return folder


def plain_loop(source: str, out: str) -> dict:
    """The one-process alternative, fixed whatever the tree: read, verify by a 1/8-scale decode, write with
    tf.io.TFRecordWriter (GZIP); its own clock starts after TensorFlow is imported."""
    import tensorflow as tf

    from components.contracts import schema

    started, cpu = time.perf_counter(), time.process_time()
    files = sorted(Path(source).rglob("*.jpg"))
    labels = sorted({path.parent.name for path in files})
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    writers = {split: tf.io.TFRecordWriter(str(Path(out) / f"{split}.tfrecord.gz"), options) for split in ("train", "eval")}
    for index, path in enumerate(files):
        data = path.read_bytes()
        image = Image.open(io.BytesIO(data))
        image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
        writers["eval" if index % 10 == 0 else "train"].write(schema.encode_example(
            encoded=data, image_format="jpeg", height=image.height, width=image.width,
            label=labels.index(path.parent.name), text=path.parent.name, source=str(path)))
    for writer in writers.values():
        writer.close()
    return {"images": len(files), "seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(time.process_time() - cpu, 3)}


def run_loop(source: Path, out: Path) -> dict:
    """plain_loop in its own process, as a user would run it: wall clock and its own clock."""
    out.mkdir(parents=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.ingest_stages", "loop", str(source), str(out)],
                          capture_output=True, text=True, check=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2"))
    return {"wall_seconds": round(time.perf_counter() - started, 2), **json.loads(done.stdout.strip().splitlines()[-1])}


def side_by_side(args) -> dict:
    runs: dict[str, list[dict]] = {"before": [], "now": [], "loop": []}
    with tempfile.TemporaryDirectory(prefix="stoke-bench-side-by-side-") as tmp:
        tmp = Path(tmp)
        before = tmp / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), args.before],
                       check=True, capture_output=True)
        try:
            megabytes = make_images(tmp / "source", args.images, args.size, args.photos)
            for i in range(args.rounds):
                for name in ("before", "now", "loop") if i % 2 == 0 else ("now", "before", "loop"):
                    # What the last run (or making the images) wrote goes to disk now, not in the kernel's
                    # writeback 30 s later, in the middle of the next program's run.
                    os.sync()
                    if name == "loop":
                        runs[name].append(run_loop(tmp / "source", tmp / f"loop-{i}"))
                    else:
                        tree = str(before if name == "before" else REPO)
                        runs[name].append(stoke_ingest(tmp / "source", tmp / f"root-{name}-{i}", tree=tree))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)
    median = {name: {key: statistics.median(r[key] for r in found) for key in ("wall_seconds", "seconds")}
              for name, found in runs.items()}

    def ratio(slow: str, fast: str, key: str) -> float:
        return round(median[slow][key] / median[fast][key], 2)

    return {"before": args.before, "images": args.images, "size": args.size, "photos": args.photos,
            "input_mb": round(megabytes, 1), "rounds": args.rounds, "cores": os.cpu_count(), "runs": runs,
            "median": median,
            "ratios": {"now_vs_before_wall": ratio("before", "now", "wall_seconds"),
                       "now_vs_before_own_clock": ratio("before", "now", "seconds"),
                       "now_vs_loop_wall": ratio("loop", "now", "wall_seconds"),
                       "now_vs_loop_own_clock": ratio("loop", "now", "seconds"),
                       "before_vs_loop_wall": ratio("loop", "before", "wall_seconds"),
                       "before_vs_loop_own_clock": ratio("loop", "before", "seconds")}}


def main() -> None:
    if sys.argv[1:2] == ["loop"]:  # the plain loop's own process (run_loop)
        print(json.dumps(plain_loop(*sys.argv[2:4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("stages", "side-by-side"))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", default="320x240")
    parser.add_argument("--photos", action="store_true", help="JPEGs made from packaged photographs")
    parser.add_argument("--sample", type=int, default=300, help="images the stages are timed on")
    parser.add_argument("--before", default="dad2a31", help="the earlier commit (side-by-side)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(stages(args) if args.mode == "stages" else side_by_side(args), indent=1))


if __name__ == "__main__":
    main()
