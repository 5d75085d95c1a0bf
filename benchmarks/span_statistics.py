"""What a span's statistics cost per record, side by side with what ingest spends on the record itself.

    python benchmarks/span_statistics.py [--records 200000] [--rounds 5]

Times beam_jobs/statistics.py (both splits' DatasetFeatureStatisticsLists, serialized) on synthetic
signatures of `--records` records (10 classes, unique URIs, a tenth in eval), against normalize() of
a 320x240 JPEG (read-verify-decode, what every record costs ingest before it is written), in CPU time,
alternating; prints one JSON object with medians and their ratio.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from beam_jobs.statistics import statistics as span_statistics
from benchmarks.jpeg_spans import make_photos
from components.common.images import normalize


def signatures(count: int) -> list[dict]:
    rng = random.Random(0)
    return [{"uri": f"s3://bucket/photos/class{i % 10}/{i:08d}.jpg", "label": f"class{i % 10}",
             "split": "eval" if rng.random() < 0.1 else "train", "format": "png" if i % 7 == 0 else "jpeg",
             "width": rng.choice((320, 640, 1024)), "height": rng.choice((240, 480, 768)),
             "bytes": rng.randint(5_000, 90_000), "mean": rng.uniform(0, 255), "std": rng.uniform(0, 80)}
            for i in range(count)]


def cpu_us(work, per: int) -> float:
    started = time.process_time()
    work()
    return 1e6 * (time.process_time() - started) / per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kept, labels = signatures(args.records), [f"class{i}" for i in range(10)]
    with tempfile.TemporaryDirectory() as tmp:
        [(path, _)] = make_photos(Path(tmp), 1)  # what benchmarks/ingest.py ingests
        jpeg = path.read_bytes()
    per_record, per_image = [], []
    for _ in range(args.rounds):
        per_record.append(cpu_us(lambda: [s.SerializeToString() for s in span_statistics(kept, [], labels).values()],
                                 args.records))
        per_image.append(cpu_us(lambda: [normalize(jpeg) for _ in range(200)], 200))
    result = {"records": args.records, "rounds": args.rounds,
              "statistics_cpu_us_per_record": round(statistics.median(per_record), 2),
              "normalize_cpu_us_per_320x240_jpeg": round(statistics.median(per_image), 1)}
    result["statistics_vs_normalize"] = round(result["statistics_cpu_us_per_record"]
                                              / result["normalize_cpu_us_per_320x240_jpeg"], 4)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
