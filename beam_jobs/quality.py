"""Image-quality issues at cleanvision's level, judged from the scores ingest takes in its one decode
(components/common/quality_scores.py) against the ingest settings; each issue is either set aside (a dead
letter with its reason, as blank frames are) or reported (kept, and named by the data check).

Per image, in the Beam job: blurry, dark, light, low-information, odd aspect ratio, grayscale.
Over the span, in the driver: odd size, an image whose size (the square root of its area, as
cleanvision measures it) lies outside the span's interquartile fence (q1 - k IQR, q3 + k IQR) and
more than twice or under half the span's median (so a span of one size does not call 321x240 odd).
"""
from __future__ import annotations

import collections
import math
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the driver's: the image workers judge images without pydantic's 0.15 s
    from components.contracts.results import QualityFinding

EXAMPLES, FOLDERS = 5, 5
# The dead-letter reason of each issue begins with its word (beam_jobs/ingest.py reads them back).
WORDS = {"blurry": "blurry image", "dark": "dark image", "light": "light image",
         "low_information": "low-information image", "odd_aspect_ratio": "odd aspect ratio",
         "odd_size": "odd size", "grayscale": "grayscale image"}
SPREAD_BELOW = 19.8  # cleanvision's colour threshold (0.18 = 1 - exp(-0.01 x)): above, a histogram is concentrated


@dataclass(frozen=True)
class Rules:
    """The quality settings of ingest (components/contracts/config.py): 0 turns a measure off."""

    blurry_below: float = 0.0
    dark_below: float = 0.0
    light_above: float = 0.0
    low_information_below: float = 0.0
    odd_aspect_below: float = 0.0
    odd_size_iqr: float = 0.0
    grayscale: bool = False
    set_aside: frozenset[str] = frozenset()

    @classmethod
    def of(cls, config) -> Rules:
        return cls(config.blurry_below, config.dark_below, config.light_above, config.low_information_below,
                   config.odd_aspect_below, config.odd_size_iqr, config.report_grayscale,
                   frozenset(filter(None, config.quality_set_aside.split(","))))


def issues(scores: dict, width: int, height: int, rules: Rules) -> dict[str, str]:
    """The per-image issues of one image: issue -> what was measured, as a reason's words."""
    found = {}
    if rules.blurry_below and scores["sharpness"] < rules.blurry_below and scores["spread"] <= SPREAD_BELOW:
        found["blurry"] = f"variance of the Laplacian {scores['sharpness']:.0f}, below {rules.blurry_below:g}"
    if rules.dark_below and scores["dark"] < rules.dark_below:
        found["dark"] = f"99th percentile of brightness {scores['dark']:.2f}, below {rules.dark_below:g}"
    if rules.light_above and scores["light"] > rules.light_above:
        found["light"] = f"5th percentile of brightness {scores['light']:.2f}, above {rules.light_above:g}"
    if rules.low_information_below and scores["entropy"] < rules.low_information_below:
        found["low_information"] = f"grey entropy {scores['entropy']:.2f} bits, below {rules.low_information_below:g}"
    aspect = min(width, height) / max(width, height)
    if rules.odd_aspect_below and aspect < rules.odd_aspect_below:
        found["odd_aspect_ratio"] = f"{width}x{height}, sides {aspect:.2f} to 1, below {rules.odd_aspect_below:g}"
    if rules.grayscale and scores["colour"] <= 2:
        found["grayscale"] = "RGB with equal channels"
    return found


def reason(issue: str, measured: str) -> str:
    return f"{WORDS[issue]}: {measured} (ingest.quality_set_aside names {issue})"


def odd_sizes(kept: list[dict], factor: float) -> dict[int, str]:
    """Index in `kept` -> what was measured, for the records of odd size within the span."""
    if not factor or len(kept) < 4:
        return {}
    sizes = np.array([math.sqrt(s["width"] * s["height"]) for s in kept])
    q1, median, q3 = np.percentile(sizes, [25, 50, 75])
    low, high = q1 - factor * (q3 - q1), q3 + factor * (q3 - q1)
    return {i: f"{kept[i]['width']}x{kept[i]['height']} against the span's median of {median:.0f} px "
               f"(fence {max(low, 0):.0f}-{high:.0f})"
            for i, size in enumerate(sizes) if (size < low or size > high) and not 0.5 <= size / median <= 2}


def settle_odd_sizes(kept: list[dict], rules: Rules) -> list[tuple[dict, str]]:
    """Marks the span's records of odd size with the issue, or returns them with their reason when
    ingest.quality_set_aside names it."""
    aside = []
    for i, measured in odd_sizes(kept, rules.odd_size_iqr).items():
        if "odd_size" in rules.set_aside:
            aside.append((kept[i], reason("odd_size", measured)))
        else:
            kept[i]["issues"] = sorted({*kept[i].get("issues", ()), "odd_size"})
    return aside


def findings(kept: list[dict]) -> list[QualityFinding]:
    """The reported issues of the span's records: count, the first URIs, and the fullest folders. A span
    of nothing but grayscale images (scans, digits) is a grayscale dataset, not one with an issue."""
    from components.contracts.results import QualityFinding
    by_issue: dict[str, list[str]] = collections.defaultdict(list)
    for signature in sorted(kept, key=lambda s: s["uri"]):
        for issue in signature.get("issues", ()):
            by_issue[issue].append(signature["uri"])
    if len(by_issue.get("grayscale", ())) == len(kept):
        by_issue.pop("grayscale", None)
    return [QualityFinding(kind=issue, count=len(uris), examples=uris[:EXAMPLES],
                           folders=dict(collections.Counter(posixpath.dirname(u) for u in uris).most_common(FOLDERS)))
            for issue, uris in sorted(by_issue.items())]
