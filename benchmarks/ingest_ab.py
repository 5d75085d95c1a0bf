"""Ingest throughput of two checkouts of Stoke side by side, alternating runs on the same JPEGs.

    python benchmarks/ingest_ab.py --before /path/to/old/checkout [--after .] [--images 2000] [--rounds 3]

Each round runs `stoke ingest` (benchmarks/ingest.py's stoke_ingest: Beam, DirectRunner, a thread a core)
once with each checkout on its own PYTHONPATH, in turn, so a machine that gets busier slows both alike.
Reports the median images/s and the CPU seconds of each, and their ratios (after / before).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.ingest import stoke_ingest
from benchmarks.jpeg_spans import make_photos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default=os.getcwd())
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        make_photos(source, args.images)
        for i in range(args.rounds):
            for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                runs[name].append(stoke_ingest(source, Path(tmp) / f"root-{name}-{i}", tree=getattr(args, name)))
    median = {name: {key: statistics.median(r[key] for r in found) for key in ("images_per_sec", "cpu_seconds")}
              for name, found in runs.items()}
    print(json.dumps({"images": args.images, "rounds": args.rounds, "median": median, "runs": runs,
                      "ratio_images_per_sec": round(median["after"]["images_per_sec"] / median["before"]["images_per_sec"], 3),
                      "ratio_cpu_seconds": round(median["after"]["cpu_seconds"] / median["before"]["cpu_seconds"], 3)},
                     indent=1))


if __name__ == "__main__":
    main()
