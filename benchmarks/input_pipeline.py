"""`stoke bench input SOURCE --root ROOT --image-size N`: is the input pipeline fast enough?

Five rates in one run, in images per second to the end of each pipeline, at the same output size
and batch size, each timed after a warm-up batch:
  stoke                 components/train/data.py over ROOT's spans (what training reads)
  stoke_cached          the same with `--image-cache memory`, timed after one epoch has filled the cache
                        (measured when the training split has at most CACHED_RECORDS records)
  keras_from_directory  keras.utils.image_dataset_from_directory(SOURCE): what users use instead
  naive                 the same records and decode, as one plain `map`: no parallelism, no prefetch
  limit                 one thread decoding and resizing in-memory images with Stoke's ops, x cores:
                        what the CPU can do at most, with no reading, parsing or batching at all
Each also reports its CPU milliseconds per image (all threads): on a shared machine wall-clock
rates swing with other load, the work per image does not.
ROOT must hold spans ingested from SOURCE (`stoke ingest SOURCE --root ROOT`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import tensorflow as tf

from components.common.files import filesystem
from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.contracts.layout import Root, parse_spans
from components.train import data as pipeline

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
CACHED_RECORDS = 20_000  # beyond this, filling the cache takes longer than the rest of the benchmark


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stoke bench input", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="folder of class subfolders of images (the ingest SOURCE)")
    parser.add_argument("--root", required=True, help="artifact ROOT holding spans ingested from SOURCE")
    parser.add_argument("--image-size", type=int, default=224, help="output side in pixels (default: 224)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch (default: 64)")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per pipeline (default: 40)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are kept (default: 3)")
    parser.add_argument("--spans", default=None, help="spans to read, e.g. 1,3-4 (default: all)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = parser.parse_args(argv)
    try:
        result = measure(args.source, args.root, image_size=args.image_size, batch_size=args.batch_size,
                         batches=args.batches, rounds=args.rounds, spans=parse_spans(args.spans))
    except (ValueError, FileNotFoundError) as exc:
        print(f"stoke bench input: error: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc)}))
        return 1
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
    else:
        for key in ("stoke", "stoke_cached", "keras_from_directory", "naive", "limit"):
            if key + "_images_per_sec" in result:
                print(f"{key:>22}: {result[key + '_images_per_sec']:9.1f} images/s")
    return 0


def measure(source: str, root: str, *, image_size: int, batch_size: int, batches: int,
            rounds: int = 3, spans: list[int] | None = None) -> dict:
    # Speed, not trust: a span ingested a moment ago is read before any data check has let it in.
    shards = Spans(root).shards("train", spans, checked=False)
    if not shards:
        raise ValueError(f"no published span under {Root(root).spans}; run `stoke ingest {source} --root {root}`")
    records = sum(s.records for s in shards)
    settings = TrainConfig(image_size=image_size, flip=True)  # what a training run reads; flips as the presets for photos
    pipelines = {
        "stoke": lambda: pipeline.make_dataset(shards, settings, pipeline.PipelineOptions(
            batch_size=batch_size, training=True)),
        "stoke_cached": lambda: pipeline.make_dataset(shards, settings, pipeline.PipelineOptions(
            batch_size=batch_size, training=True, cache="memory")),
        "keras_from_directory": lambda: keras_from_directory(source, image_size, batch_size),
        "naive": lambda: naive_dataset(shards, image_size, batch_size),
        "limit": lambda: single_thread_decode(source, image_size, batch_size),
    }
    # Rounds that time every pipeline in turn, keeping each one's median: a machine shared with
    # other work slows whichever pipeline runs at that moment, and alternation spreads that out.
    if records > CACHED_RECORDS:
        del pipelines["stoke_cached"]
    warm_up = {"stoke_cached": records // batch_size + 1}  # one epoch fills the cache
    samples = {key: [] for key in pipelines}
    for _ in range(rounds):
        for key, make in pipelines.items():
            samples[key].append(_rate(make(), batches, batch_size, warm_up.get(key, 2)))
    rates = {key: _median([rate for rate, _ in values]) for key, values in samples.items()}
    cpu_ms = {key: _median([ms for _, ms in values]) for key, values in samples.items()}
    cores = os.cpu_count() or 1
    # The limit: one thread's decode+resize rate, from its CPU time (what a core of its own would
    # do), times the cores.
    rates["limit"] = cores * 1000 / cpu_ms["limit"]
    result = {f"{key}_images_per_sec": value for key, value in rates.items()}
    result.update({f"{key}_cpu_ms_per_image": value for key, value in cpu_ms.items()})
    result.update({
        "stoke_vs_keras": rates["stoke"] / rates["keras_from_directory"],
        "stoke_vs_limit": rates["stoke"] / rates["limit"],
        "stoke_vs_naive": rates["stoke"] / rates["naive"],
        "stoke_cached_vs_keras": rates["stoke_cached"] / rates["keras_from_directory"] if "stoke_cached" in rates else None,
        "cores": cores, "image_size": image_size, "batch_size": batch_size, "timed_batches": batches,
        "rounds": rounds,
        "train_records": records,
    })
    return result


def _rate(dataset: tf.data.Dataset, batches: int, batch_size: int, warm_up: int = 2) -> tuple[float, float]:
    """(images/s, CPU ms per image) pulling `batches` batches after `warm_up` batches.

    CPU time is the whole process's (every tf.data thread): unlike wall time, it hardly moves when
    other programs share the machine, so it compares the work each pipeline does per image."""
    iterator = iter(dataset.repeat())
    for _ in range(warm_up):
        next(iterator)
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(batches):
        next(iterator)
    images = batches * batch_size
    return images / (time.perf_counter() - start), 1000 * (time.process_time() - cpu) / images


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def keras_from_directory(source: str, image_size: int, batch_size: int) -> tf.data.Dataset:
    import keras

    return keras.utils.image_dataset_from_directory(
        source, image_size=(image_size, image_size), batch_size=batch_size, shuffle=True, verbose=False)


def naive_dataset(shards, image_size: int, batch_size: int) -> tf.data.Dataset:
    """The tutorial pipeline: files in order, one `map`, no parallel calls, no prefetch."""
    records = tf.data.TFRecordDataset([s.uri for s in shards], compression_type=shards[0].compression)

    def decode(serialized):
        encoded, label = pipeline.parse(serialized)
        return pipeline.decode_train(encoded, image_size), label

    options = tf.data.Options()
    options.autotune.enabled = False
    return records.map(decode).batch(batch_size, drop_remainder=True).with_options(options)


def single_thread_decode(source: str, image_size: int, batch_size: int) -> tf.data.Dataset:
    """Stoke's per-image ops on one thread over encoded images already in memory."""
    fs, _ = filesystem(source)
    encoded = [fs.cat_file(path) for path in source_files(source)[: 16 * batch_size]]
    dataset = tf.data.Dataset.from_tensor_slices(encoded).cache()
    dataset = dataset.map(lambda b: pipeline.decode_train(b, image_size)).batch(batch_size)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options)


def source_files(source: str) -> list[str]:
    fs, base = filesystem(source)
    files = sorted(p for p in fs.find(base) if p.lower().endswith(IMAGE_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"no JPEG or PNG files under {source}")
    return files


if __name__ == "__main__":
    sys.exit(run())
