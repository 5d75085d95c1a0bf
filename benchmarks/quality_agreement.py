"""Stoke's image-quality issues beside cleanvision's, on the same images made here.

    python benchmarks/quality_agreement.py --cleanvision-python /tmp/cv-venv/bin/python [--count 30]

cleanvision (pip install cleanvision) is no dependency of Stoke: it pulls pandas, matplotlib and scipy,
so it runs in a scratch venv of its own, named by --cleanvision-python, on the folder this script
writes. The images are crops of the photographs scikit-image and scikit-learn ship, at 320x240 with
sensor noise, and the same crops blurred, darkened, lightened, posterized to two grey levels, cut
into strips, shrunk or enlarged (odd sizes), and stored as grayscale (mode L, as cleanvision counts
grayscale). Stoke's verdicts come from ingest's own code (normalize, beam_jobs/quality.py) at the
default settings. Prints one JSON object: per issue, how many images each flagged, both, and the
agreement (Cohen's kappa beside the plain share of images judged alike).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from beam_jobs import quality
from benchmarks.jpeg_spans import packaged_photos
from components.common.images import normalize
from components.contracts.config import IngestConfig

ISSUES = ("blurry", "dark", "light", "low_information", "odd_aspect_ratio", "odd_size", "grayscale")
CLEANVISION = """import json, sys
from cleanvision import Imagelab
lab = Imagelab(data_path=sys.argv[1])
lab.find_issues({name: {} for name in %r})
issues = lab.issues
print(json.dumps({str(path): {name: bool(issues.loc[path, f"is_{name}_issue"]) for name in %r} for path in issues.index}))
"""


def variants(photo: np.ndarray, rng: np.random.Generator) -> dict[str, Image.Image]:
    rows, cols = photo.shape[:2]
    top, left = rng.integers(0, rows - 240 + 1), rng.integers(0, cols - 320 + 1)
    crop = photo[top:top + 240, left:left + 320].astype(np.float32)
    noisy = np.clip(crop + rng.normal(0, 4, crop.shape), 0, 255)
    clean = Image.fromarray(noisy.astype(np.uint8))
    grey = np.asarray(clean.convert("L"), np.float32)
    return {
        "clean": clean,
        "blurry": clean.filter(ImageFilter.GaussianBlur(float(rng.choice([2.0, 3.0, 5.0])))),
        "slightly_blurred": clean.filter(ImageFilter.GaussianBlur(1.0)),
        "dark": Image.fromarray((noisy * rng.uniform(0.08, 0.25)).astype(np.uint8)),
        "dim": Image.fromarray((noisy * 0.5).astype(np.uint8)),
        "light": Image.fromarray((255 - (255 - noisy) * rng.uniform(0.02, 0.06)).astype(np.uint8)),
        "low_information": Image.fromarray(np.where(grey > grey.mean(), 200, 60).astype(np.uint8)).convert("RGB"),
        "strip": clean.crop((0, 100, 320, 140)),
        "tiny": clean.resize((24, 18)),
        "huge": clean.resize((1920, 1440), Image.BICUBIC),
        "grayscale": clean.convert("L"),
    }


def make(folder: Path, count: int) -> dict[str, str]:
    """Writes the images; returns file name -> variant."""
    rng, photos, made = np.random.default_rng(0), packaged_photos(), {}
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        for variant, image in variants(photos[i % len(photos)], rng).items():
            name = f"{i:03d}-{variant}.png"
            image.save(folder / name)
            made[name] = variant
    return made


def stoke(folder: Path, names: list[str]) -> dict[str, dict[str, bool]]:
    rules = quality.Rules.of(IngestConfig())
    found, sizes = {}, []
    for name in names:
        image = normalize((folder / name).read_bytes(), max_side=0)
        found[name] = quality.issues(image.pixels.quality.as_dict(), image.width, image.height, rules)
        sizes.append({"width": image.width, "height": image.height})
    odd = quality.odd_sizes(sizes, rules.odd_size_iqr)
    return {name: {issue: issue in found[name] or (issue == "odd_size" and i in odd) for issue in ISSUES}
            for i, name in enumerate(names)}


def kappa(a: np.ndarray, b: np.ndarray) -> float | None:
    agree = (a == b).mean()
    chance = a.mean() * b.mean() + (1 - a.mean()) * (1 - b.mean())
    return None if chance == 1 else round(float((agree - chance) / (1 - chance)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cleanvision-python", required=True, help="a Python with cleanvision installed")
    parser.add_argument("--count", type=int, default=30, help="crops; each gives every variant")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "images"
        made = make(folder, args.count)
        names = sorted(made)
        ours = stoke(folder, names)
        script = CLEANVISION % (ISSUES, ISSUES)
        out = subprocess.run([args.cleanvision_python, "-c", script, str(folder)], check=True, capture_output=True,
                             text=True).stdout
        theirs = {Path(path).name: verdict for path, verdict in json.loads(out.strip().splitlines()[-1]).items()}
    result = {"images": len(names), "variants": sorted(set(made.values())), "issues": {}}
    for issue in ISSUES:
        a = np.array([ours[n][issue] for n in names])
        b = np.array([theirs[n][issue] for n in names])
        by_variant = {v: [int(sum(ours[n][issue] for n in names if made[n] == v)),
                          int(sum(theirs[n][issue] for n in names if made[n] == v))] for v in result["variants"]}
        result["issues"][issue] = {
            "stoke": int(a.sum()), "cleanvision": int(b.sum()), "both": int((a & b).sum()),
            "agreement": round(float((a == b).mean()), 3), "kappa": kappa(a, b),
            "by_variant_stoke_cleanvision": {v: c for v, c in by_variant.items() if any(c)}}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
