"""The data a run reads: tf.data from published spans, fast enough that the accelerator never waits.

Order of work, cheapest first: shuffle shard FILES, interleave GZIP readers in parallel, shuffle the
small encoded records (not decoded images, which are 10-50x larger), then one parallel map that
parses, decodes only what the crop keeps, resizes and flips, then batch with a fixed shape (XLA
compiles one program) and prefetch. Output images are uint8: a quarter of the bytes of float32 to
copy to the device; the model rescales them.

Also here, each in its section: evaluation's batches (every eval record once), the image cache on
disk (train.image_cache), the tf.data service as the input (train.data_service) and the shards staged
from a bucket TensorFlow cannot read. The decode/resize functions are shared with the serving
signature (models.py), so a served image goes through exactly the evaluation preprocessing.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import re
import sys
import time

import tensorflow as tf

from components.common.program import setting_hint
from components.common.shard_cache import ShardCache, shards_of_worker
from components.common.shard_digests import Mismatch
from components.common.shard_scan import ShardScan
from components.contracts import schema
from components.contracts.config import TrainConfig
from components.contracts.layout import Shard
from components.train.data_service import ServiceError, workers

AUTOTUNE = tf.data.AUTOTUNE
# Light augmentation: a random crop keeping half the image or more, at a moderate aspect ratio.
CROP_AREA = (0.5, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)
JPEG_RATIOS = (1, 2, 4, 8)


# ---------------------------------------------------------------- decode (shared with serving)

def jpeg_ratio(height, width, size: int):
    """Largest DCT downscale (1, 2, 4, 8) that still leaves both sides >= size: libjpeg then skips
    most of the inverse DCT, and the resize after it never shrinks by more than 2x (no aliasing)."""
    short = tf.minimum(height, width)
    index = tf.constant(0, tf.int32)
    for i, ratio in enumerate(JPEG_RATIOS[1:], start=1):
        index = tf.where(short >= ratio * size, tf.constant(i, tf.int32), index)
    return index


def _decode_jpeg(encoded, size, crop_window=None):
    """JPEG decode at the cheapest DCT ratio, of the whole image or of `crop_window` [y, x, h, w]."""
    if crop_window is None:
        shape = tf.io.extract_jpeg_shape(encoded)
        index = jpeg_ratio(shape[0], shape[1], size)
        branches = [lambda r=r: tf.io.decode_jpeg(encoded, channels=3, ratio=r) for r in JPEG_RATIOS]
    else:
        index = jpeg_ratio(crop_window[2], crop_window[3], size)
        # With a DCT ratio the crop window is in the coordinates of the downscaled image.
        branches = [lambda r=r: tf.io.decode_and_crop_jpeg(
                        encoded, tf.maximum(crop_window // r, [0, 0, 1, 1]), channels=3, ratio=r)
                    for r in JPEG_RATIOS]
    return tf.switch_case(index, branches)


def _decode_other(encoded):
    # PNG per the record contract; decode_image also takes GIF/BMP/WebP sent to the serving signature.
    image = tf.io.decode_image(encoded, channels=3, dtype=tf.uint8, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def resize(image, size: int):
    """Resize to size x size as uint8; bilinear never overshoots, so rounding cannot wrap."""
    resized = tf.image.resize(image, [size, size], method="bilinear")
    return tf.cast(tf.round(resized), tf.uint8)


def header_pixels(encoded):
    """width x height (int64) as JPEG, PNG, GIF, BMP and WebP headers declare them, without decoding
    a pixel; 0 for bytes of no known format (which the decoders then refuse on their own)."""
    head = tf.strings.substr(tf.strings.join([tf.strings.substr(encoded, 0, 32), b"\0" * 32]), 0, 32)
    b = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)

    def number(start, length, big_endian=False):
        order = range(length) if big_endian else reversed(range(length))
        value = tf.constant(0, tf.int64)
        for i in order:
            value = value * 256 + b[start + i]
        return value

    def starts(text, at=0):
        return tf.equal(tf.strings.substr(head, at, len(text)), text)

    chunk = tf.strings.substr(head, 12, 4)
    # VP8L packs width-1 and height-1 into 14 bits each, from byte 21.
    lossless = number(21, 4)
    webp = tf.where(tf.equal(chunk, b"VP8X"), (number(24, 3) + 1) * (number(27, 3) + 1),
                    tf.where(tf.equal(chunk, b"VP8L"), (lossless % 16384 + 1) * (lossless // 16384 % 16384 + 1),
                             (number(26, 2) % 16384) * (number(28, 2) % 16384)))
    bmp_height = number(22, 4)  # signed: negative when the rows are stored top-down
    bmp_height = tf.where(bmp_height >= 2**31, 2**32 - bmp_height, bmp_height)
    pixels = tf.constant(0, tf.int64)
    for known, count in ((starts(b"\x89PNG"), number(16, 4, True) * number(20, 4, True)),
                         (starts(b"GIF8"), number(6, 2) * number(8, 2)),
                         (starts(b"BM"), number(18, 4) * bmp_height),
                         (starts(b"RIFF") & starts(b"WEBP", 8), webp)):
        pixels = tf.where(known, count, pixels)

    def jpeg():
        return tf.cast(tf.reduce_prod(tf.io.extract_jpeg_shape(encoded)[:2]), tf.int64)

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, lambda: pixels)


def refuse_oversized(encoded, max_pixels: int):
    """`encoded`, once its header says it holds at most `max_pixels`: a few hundred bytes can declare
    a 13000x13000 image whose decoding takes gigabytes, so the check comes before any decoding."""
    pixels = header_pixels(encoded)
    check = tf.debugging.assert_less_equal(
        pixels, tf.constant(max_pixels, tf.int64),
        message=f"image refused: its header declares more than {max_pixels / 1e6:g} megapixels")
    with tf.control_dependencies([check]):
        return tf.identity(encoded)


def decode_eval(encoded, size: int, max_pixels: int | None = None):
    """The deterministic preprocessing of evaluation and serving: whole image to size x size uint8.

    With `max_pixels` (serving), larger images are refused before decoding; the spans' records
    were checked on ingest."""
    if max_pixels:
        encoded = refuse_oversized(encoded, max_pixels)
    image = tf.cond(tf.io.is_jpeg(encoded),
                    lambda: _decode_jpeg(encoded, size),
                    lambda: _decode_other(encoded))
    return resize(image, size)


def random_crop_window(shape, seed=None):
    """A random [y, x, h, w] covering CROP_AREA of the image at an aspect ratio in CROP_ASPECT.

    Random ops here are stateless, drawn from a per-record `seed` ([2] int) when the pipeline has
    one: with a seed, the same record gets the same crop on the same epoch in every run."""
    begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.concat([shape, [3]], 0), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=_seed(seed),
        min_object_covered=0.0, aspect_ratio_range=CROP_ASPECT, area_range=CROP_AREA,
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    return tf.stack([begin[0], begin[1], extent[0], extent[1]])


def decode_train(encoded, size: int, flip: bool = True, seed=None):
    """Random crop + resize + random horizontal flip; for PNG the crop happens after decoding."""
    is_jpeg = tf.io.is_jpeg(encoded)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(_seed(seed), 2))

    def jpeg():
        window = random_crop_window(tf.io.extract_jpeg_shape(encoded)[:2], crop_seed)
        return resize(_decode_jpeg(encoded, size, window), size)

    def other():
        return augment_decoded(_decode_other(encoded), size, crop_seed, flip=False)

    image = tf.cond(is_jpeg, jpeg, other)
    return tf.image.stateless_random_flip_left_right(image, flip_seed) if flip else image


def augment_decoded(image, size: int, seed=None, flip: bool = False):
    """Random crop + resize (+ flip) of an already decoded image (the path used after `cache`)."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(_seed(seed), 2))
    window = random_crop_window(tf.shape(image)[:2], crop_seed)
    image = resize(tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3]), size)
    return tf.image.stateless_random_flip_left_right(image, flip_seed) if flip else image


def _seed(seed):
    """A stateless op's [2] seed: the one given, else a fresh random one."""
    if seed is None:
        return tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
    return tf.cast(seed, tf.int32)


def parse(serialized):
    """The two features training needs from a serialized tf.Example."""
    spec = schema.feature_spec()
    features = tf.io.parse_single_example(serialized, {k: spec[k] for k in (schema.ENCODED, schema.LABEL)})
    return features[schema.ENCODED], tf.cast(features[schema.LABEL], tf.int32)


# ---------------------------------------------------------------- datasets

@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """What one input pipeline reads beside the run's settings (`train`, which make_dataset takes too):
    what the run derives from them for this pipeline, and a few knobs the benchmarks turn."""
    batch_size: int  # per input pipeline (per replica under a strategy)
    training: bool
    # None: no cache; "memory"; or the name of tf.data's file cache, used as given: one bound to what it holds
    # (claim_cache names it for the shards, the settings and the input pipeline)
    cache: str | None = None
    seed: int | None = None  # this pipeline's: fixes file and record shuffles and every crop and flip
    # Evaluation: with a number of batches, (image, label, weight) examples padded to exactly that
    # many with blanks of weight 0; real records weigh eval_weight (see "evaluation's batches" below).
    eval_batches: int | None = None
    eval_weight: float = 1.0
    # (span, image/source) of the records to leave out: a file rewritten in place is in two spans under one source
    exclude: tuple[tuple[int, str], ...] = ()
    repeat: bool = True  # training only: evaluation reads each record once
    ram_budget_fraction: float = 0.5  # share of physical memory tf.data autotuning may use
    private_threads: int | None = None  # size of a private threadpool; None shares TF's pool


def make_dataset(shards: list[Shard], train: TrainConfig, options: PipelineOptions,
                 input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """(uint8 images [B, S, S, 3], int32 labels [B]) batches from shard files, plus float32 weights [B]
    with `eval_batches`; training repeats the records, evaluation reads each once. Of the settings it
    reads train.image_size, train.flip, train.shuffle_buffer and train.skip_corrupt."""
    if not shards:
        raise ValueError("no shard files to read")
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    records = _records(shards, train, options, pipelines, pipeline_id)
    cache = options.cache
    if options.training:
        dataset = _decoded(records, train, options) if cache is None else _decoded_cached(records, train, options)
        dataset = dataset.repeat() if options.repeat else dataset
    else:
        dataset = _decoded(records, train, options)
        if cache is not None:  # the decoded records, before any blank: the first blank asked for ends them
            dataset = dataset.cache("" if cache == "memory" else cache)
        if options.eval_batches:
            dataset = padded(dataset, options.eval_batches * options.batch_size, options.eval_weight)
    dataset = dataset.batch(options.batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE,
                            deterministic=_in_order(options))
    dataset = dataset.prefetch(AUTOTUNE)
    return dataset.with_options(_options(options))


def _in_order(options: PipelineOptions) -> bool:
    """Parallel work may finish out of order, which is faster; with a seed, the order is kept."""
    return not options.training or options.seed is not None


def _records(shards: list[Shard], train: TrainConfig, options: PipelineOptions, pipelines: int,
             pipeline_id: int) -> tf.data.Dataset:
    """This input pipeline's serialized records, files shuffled when training."""
    # Shard by FILE when every worker gets at least one file (no worker reads what it throws
    # away); by DATA otherwise (every worker reads everything and keeps 1/N of the records).
    files = tf.data.Dataset.from_tensor_slices(([s.uri for s in shards], [s.compression for s in shards],
                                                [s.span for s in shards]))
    if by_file(len(shards), pipelines):
        files = files.shard(pipelines, pipeline_id)
    if options.training:
        files = files.shuffle(len(shards), seed=options.seed, reshuffle_each_iteration=True)

    def read(uri, compression, span):
        records = tf.data.TFRecordDataset(uri, compression_type=compression, buffer_size=4 << 20)
        # A bad CRC ends that shard's reading (the reader cannot find the next record boundary);
        # the training report counts the records lost (see components/common/shard_scan.py).
        records = records.ignore_errors() if train.skip_corrupt else records
        # Records to leave out are named by span and source: each record goes with its shard's span to the filter.
        return records.map(lambda record: (record, span)) if options.exclude else records

    records = files.interleave(read, cycle_length=min(len(shards), 16), block_length=1,
                               num_parallel_calls=AUTOTUNE, deterministic=_in_order(options))
    if pipelines > 1 and not by_file(len(shards), pipelines):
        records = records.shard(pipelines, pipeline_id)
    return without(records, options.exclude) if options.exclude else records


def without(records: tf.data.Dataset, left_out: tuple[tuple[int, str], ...]) -> tf.data.Dataset:
    """The serialized records of (record, span) pairs whose (span, image/source) is none of `left_out`: each
    record's 64-bit fingerprint of the two searched in the sorted fingerprints of those left out. By span as
    well as source: a file rewritten in place comes back in a new span under its old source, and its new
    record stays when its old one is left out. Plain ops, no lookup table, so the filter runs wherever the
    pipeline does (tf.data service workers too); two records share a fingerprint about once in 2^63."""
    keys = tf.sort(tf.unique(_fingerprint(tf.constant([span for span, _ in left_out], tf.int64),
                                          tf.constant([source for _, source in left_out]))).y)
    spec = {schema.SOURCE: schema.feature_spec()[schema.SOURCE]}

    def kept(serialized, span):
        key = _fingerprint(span, tf.io.parse_single_example(serialized, spec)[schema.SOURCE])
        at = tf.minimum(tf.searchsorted(keys, tf.reshape(key, [1]))[0], tf.size(keys, out_type=tf.int32) - 1)
        return tf.not_equal(keys[at], key)

    return records.filter(kept).map(lambda serialized, span: serialized)


def _fingerprint(span, source):
    """A record's (span, image/source) as one 64-bit number: the span's digits end at the first space."""
    joined = tf.strings.join([tf.strings.as_string(tf.cast(span, tf.int64)), source], separator=" ")
    return tf.strings.to_hash_bucket_fast(joined, 2**63 - 1)


def _decoded(records: tf.data.Dataset, train: TrainConfig, options: PipelineOptions) -> tf.data.Dataset:
    """(image, label) from each record: cropped and flipped at random when training, whole otherwise."""
    size = train.image_size
    if not options.training:
        def decode(serialized):
            encoded, label = parse(serialized)
            return decode_eval(encoded, size), label

        return records.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)

    records = _with_seeds(records.shuffle(train.shuffle_buffer, seed=options.seed), options.seed)

    def decode_random(serialized, seed):
        encoded, label = parse(serialized)
        return decode_train(encoded, size, bool(train.flip), seed), label

    return records.map(decode_random, num_parallel_calls=AUTOTUNE, deterministic=_in_order(options))


def _decoded_cached(records: tf.data.Dataset, train: TrainConfig, options: PipelineOptions) -> tf.data.Dataset:
    """Training's _decoded, with decoded full images cached; crops and flips stay random on every epoch."""
    size = train.image_size
    in_order = _in_order(options)

    def decode_full(serialized):
        encoded, label = parse(serialized)
        image = tf.cond(tf.io.is_jpeg(encoded), lambda: _decode_jpeg(encoded, size),
                        lambda: _decode_other(encoded))
        return image, label

    dataset = records.map(decode_full, num_parallel_calls=AUTOTUNE, deterministic=in_order)
    dataset = dataset.cache("" if options.cache == "memory" else options.cache)
    dataset = _with_seeds(dataset.shuffle(train.shuffle_buffer, seed=options.seed), options.seed)

    def augment(decoded, seed):
        image, label = decoded
        return augment_decoded(image, size, seed, bool(train.flip)), label

    return dataset.map(augment, num_parallel_calls=AUTOTUNE, deterministic=in_order)


def _with_seeds(dataset: tf.data.Dataset, seed: int | None) -> tf.data.Dataset:
    """Each element with a [2] seed for its crop and flip, new on every pass over the data."""
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    return tf.data.Dataset.zip(dataset, seeds)


def _options(options: PipelineOptions) -> tf.data.Options:
    opts = tf.data.Options()
    opts.deterministic = _in_order(options)
    opts.autotune.enabled = True
    opts.autotune.ram_budget = int(_physical_memory() * options.ram_budget_fraction)
    if options.private_threads:
        opts.threading.private_threadpool_size = options.private_threads
    # We shard by hand (above), so tf.distribute must not shard again.
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return opts


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


# ---------------------------------------------------------------- evaluation's batches
# Evaluation counts every eval record exactly once per epoch, in whole batches.
#
# Keras evaluates in whole batches: XLA compiles one static shape, and under a strategy every replica
# of every worker runs every step. The eval split rarely fills its last batch, and repeating records
# to fill it made training's per-epoch figures differ from the gate's (TFMA scores each record once).
# So each input pipeline appends blank examples to its records up to the same number of whole
# batches, and every example carries a sample weight, 0 for a blank one. The trade-off: up to a batch
# of wasted predictions per replica and step count (more on a worker whose share of the records is
# short), for one compiled program and the same exact figures under every strategy.
#
# A record's weight is not 1 but predictions / records (the padded count over the record count).
# tf_keras averages the loss per batch over the whole batch, blanks included, and its loss metric
# weighs each batch by its size; with that weight the sum over records divided by every prediction
# made is the mean over the records. Accuracy (a weighted metric: the weighted sum over the sum of
# weights) does not change with the scale. Metric totals are summed over replicas and workers before
# they are read, so the figures are exact on one device, mirrored, and across workers alike.

def by_file(shards: int, pipelines: int) -> bool:
    """Whether input pipelines share the files (every pipeline gets one at least) rather than the
    records of every file (each reads everything and keeps 1/N)."""
    return pipelines > 1 and shards >= pipelines


def pipeline_records(counts: list[int], pipelines: int) -> list[int]:
    """The records each input pipeline reads of shards holding `counts`, as _records shards them."""
    if by_file(len(counts), pipelines):
        return [sum(counts[index::pipelines]) for index in range(pipelines)]
    total = sum(counts)
    return [total // pipelines + (index < total % pipelines) for index in range(pipelines)]


def eval_steps(counts: list[int], pipelines: int, global_batch: int) -> int:
    """Evaluation steps that cover every pipeline's records: the same on every worker, as
    collective steps must be; 0 without records."""
    pipeline_batch = global_batch // pipelines
    return max(math.ceil(records / pipeline_batch) for records in pipeline_records(counts, pipelines))


def record_weight(records: int, steps: int, global_batch: int) -> float:
    """Every prediction made over the records evaluated (see above)."""
    return steps * global_batch / records


def padded(examples: tf.data.Dataset, size: int, weight: float) -> tf.data.Dataset:
    """(image, label, weight) examples: `examples` weighted `weight`, then blanks (zeros, weight 0)
    up to `size`; `size` must hold every record, and is a whole number of batches."""
    weighed = examples.map(lambda image, label: (image, label, tf.constant(weight, tf.float32)))
    blank = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), weighed.element_spec)
    return weighed.concatenate(tf.data.Dataset.from_tensors(blank).repeat()).take(size)


# ---------------------------------------------------------------- what the spans hold

def stored_images(shards: list[Shard], image_size: int, sample: int = 256) -> dict:
    """From the first records of one shard: the median shorter side stored, the share of JPEGs and
    the size of the whole split decoded as the image cache holds it (JPEG at its DCT ratio), in GB."""
    spec = schema.feature_spec()
    keys = (schema.HEIGHT, schema.WIDTH, schema.FORMAT)
    records = tf.data.TFRecordDataset(shards[0].uri, compression_type=shards[0].compression).take(sample)
    records = records.map(lambda r: tf.io.parse_single_example(r, {k: spec[k] for k in keys}))
    sides, decoded, jpegs = [], [], 0
    for features in records.as_numpy_iterator():
        height, width = int(features[schema.HEIGHT]), int(features[schema.WIDTH])
        is_jpeg = features[schema.FORMAT] == b"jpeg"
        ratio = max((r for r in JPEG_RATIOS if min(height, width) >= r * image_size), default=1) if is_jpeg else 1
        sides.append(min(height, width))
        decoded.append((height // ratio) * (width // ratio) * 3)
        jpegs += is_jpeg
    if not sides:
        return {}
    records_total = sum(s.records for s in shards)
    return {"stored_short_side": sorted(sides)[len(sides) // 2], "jpeg_share": jpegs / len(sides),
            "decoded_gb": records_total * sum(decoded) / len(decoded) / 1e9, "memory_gb": _physical_memory() / 1e9}


class CorruptShardError(RuntimeError):
    """A shard whose records fail their CRC check; the message names it."""

    def __init__(self, scans: list[ShardScan]):
        self.scans = scans
        names = ", ".join(f"{s.uri} ({s.error}; {s.readable} of {s.expected} records readable)" for s in scans)
        super().__init__(f"corrupt shard: {names}; rerun with {setting_hint('train', {'train.skip_corrupt': True})} "
                         "to skip its unreadable records")


# ---------------------------------------------------------------- the image cache on disk
# train.image_cache as a path: tf.data's file cache, bound to what it holds.
#
# tf.data's `cache(filename)` reads whatever a finished cache of that name holds, whatever it was filled
# from. So the name Stoke gives it carries a key of everything that decides what is cached: the digests
# of the shards read (their manifests' SHA-256, which training checked the files against) in order, the
# split and its preprocessing (training caches whole images decoded at the JPEG scale its image size
# allows, evaluation images resized to it), the image size, the records left out
# (train.drop_suspected_label_errors), train.skip_corrupt, the input pipeline among how many, CACHE_VERSION
# and TensorFlow's. Another ROOT, another span, other labels, another size is another key, and never
# reads another's cache. Crops, flips and the network's own rescaling come after the cache, so they
# are in neither. The cache is PREFIX-<split>-<key>.index and .data-*; while tf.data writes it,
# <name>_N.lockfile and <name>_N.data-*.tempstate*.
#
# A run holds <name>.lock (flock) for as long as it lives. Holding it, it removes what a killed run left
# half-written (tf.data's lockfile refuses every later run until someone deletes it), and every other
# cache of the split under the same prefix whose lock is free: what stays on disk is one cache per prefix
# and split, plus those other runs use at that moment. A run that finds the lock taken (another run on
# the same data right now) trains without the file cache and says so, rather than meet tf.data's
# lockfile. The prefix is a local path (TrainConfig checks it): the lock needs a local file system.

CACHE_VERSION = 1  # raise when what the pipeline caches changes
CACHE_LOCK = ".lock"
# What tf.data writes for a cache `name`: name.index and name.data-*, and while it writes, name_N.lockfile and
# name_N.* files with a .tempstate* ending. Nothing else under the prefix is touched.
TF_CACHE_FILES = r"(?:_\d+)?(?:\.index|\.data-\d+-of-\d+)(?:\.tempstate\d+)?|_\d+\.lockfile"
_held: dict[str, int] = {}  # cache name -> this process's lock on it, kept for the process's life


def cache_key(shards: list[Shard], train: TrainConfig, options: PipelineOptions,
              context: tf.distribute.InputContext | None = None) -> str:
    """What a cache of `shards` read with `options` by the input pipeline of `context` (None: the only
    one) holds, as 16 hex digits."""
    if any(not s.sha256 for s in shards):
        raise ValueError("a shard without a SHA-256 in its manifest cannot be cached on disk")
    fields = {"version": CACHE_VERSION, "tensorflow": tf.__version__, "shards": [s.sha256 for s in shards],
              "training": options.training, "image_size": train.image_size, "exclude": sorted(options.exclude),
              "skip_corrupt": train.skip_corrupt, "pipelines": context.num_input_pipelines if context else 1,
              "pipeline": context.input_pipeline_id if context else 0}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def claim_cache(prefix: str, split: str, key: str) -> str | None:
    """The name to give tf.data's cache of `split` under `prefix`, locked for this process, with what a killed
    run left of it and the split's other caches under the prefix that no run uses removed; None when another
    run holds it."""
    name = f"{os.path.abspath(prefix)}-{split}-{key}"
    if name in _held:
        return name
    os.makedirs(os.path.dirname(name), exist_ok=True)
    lock = _lock(name + CACHE_LOCK)
    if lock is None:
        print(f"stoke train: another run is using the image cache {name}: this run reads the shards without it",
              file=sys.stderr, flush=True)
        return None
    _held[name] = lock
    caches = _caches(prefix, split)
    if not cache_complete(name):
        _remove(caches.get(name, []), keep=name + CACHE_LOCK)  # a killed run's lockfile and half-written data
    for other, files in caches.items():
        if other != name:
            _discard(other, files)
    return name


def cache_complete(name: str) -> bool:
    """Whether tf.data finished the cache `name` (its index is there, and no writer's lockfile)."""
    folder, base = os.path.split(name)
    return os.path.exists(name + ".index") and not any(
        n.startswith(base + "_") and n.endswith(".lockfile") for n in os.listdir(folder))


def _caches(prefix: str, split: str) -> dict[str, list[str]]:
    """Every cache of `split` under `prefix`, by name, with its files: Stoke's keyed ones and the unkeyed ones
    of before (PREFIX-<split>[-<pipeline>])."""
    folder, base = os.path.split(os.path.abspath(prefix))
    shape = re.compile(rf"^({re.escape(base)}-{split}(?:-[0-9a-f]{{16}}|-\d+)?)(?:{re.escape(CACHE_LOCK)}|"
                       rf"{TF_CACHE_FILES})$")
    found: dict[str, list[str]] = {}
    for entry in os.listdir(folder):
        match = shape.match(entry)
        if match:
            found.setdefault(os.path.join(folder, match.group(1)), []).append(os.path.join(folder, entry))
    return found


def _discard(name: str, files: list[str]) -> None:
    """Removes the cache `name` when no run holds it (its lock file last, still locked)."""
    lock = _lock(name + CACHE_LOCK)
    if lock is None:
        return
    try:
        _remove(files, keep=name + CACHE_LOCK)
        _remove([name + CACHE_LOCK])
    finally:
        os.close(lock)


def _lock(path: str) -> int | None:
    """An exclusive flock on `path` (created if missing), or None when another holds it. A lock file removed
    and made again between our open and our lock is opened again, so two runs never hold one name."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _remove(paths: list[str], keep: str | None = None) -> None:
    for path in paths:
        if path != keep:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------- the tf.data service as the input
# With train.data_service the pipeline up to the batch runs on the service's workers (`stoke
# data-service`), the trainer only receives batches. Evaluation stays in the trainer.
#
# Processing mode: `distributed_epoch`. The dispatcher hands each split (a shard file) of a pass over
# the data to one worker, so every training record is read once per pass across all workers, as
# in-process. `parallel_epochs` would have every worker run every pass: with N workers each record N
# times an epoch.
#
# The workers run the in-process pipeline unchanged, repeat included: the dispatcher hands out the
# files of pass 2 once those of pass 1 are all handed out, each worker batches its own stream, and the
# trainer takes batches from whichever worker has one. Nothing waits at an epoch's end, and a lost
# worker never stalls the stream (a finite pass would wait for the lost worker's part forever).
#
# What changes against in-process training:
# - A Keras epoch is steps_per_epoch batches as before, but the passes of the workers overlap at their
#   edges: a worker may start pass 2 while another finishes pass 1. Over the run each record is read
#   once per pass.
# - train.seed still fixes initialisation and each worker's shuffles, crops and flips, but which worker
#   reads which file, and so the order of batches, depends on timing: runs are not bit-reproducible.
# - A worker lost mid-pass loses what it held: the rest of its file and its buffered batches are not
#   handed out again in that pass (at most once); the other workers go on, and later passes read every
#   record. The dispatcher stops assigning work to it after `--worker-timeout` without a heartbeat
#   (GetWorkers still lists it: the workers a run records are those registered).
# - Resuming (the same run id) starts at a fresh pass, as in-process training does.

PROCESSING_MODE = "distributed_epoch"
# Workers may join after the trainer starts (a Deployment scaling up beside the Job): wait this long.
WORKER_WAIT_SECONDS = 60.0


def connect(address: str, wait: float = WORKER_WAIT_SECONDS) -> dict:
    """What the run records of the service: its address, mode and workers, once it has one."""
    deadline = time.monotonic() + wait
    while not (found := workers(address)) and time.monotonic() < deadline:
        time.sleep(1.0)
    if not found:
        raise ServiceError(f"the tf.data service dispatcher at {address} has no workers after {wait:g} s; start "
                           f"some with `stoke data-service worker --dispatcher {address.removeprefix('grpc://')}`")
    return {"address": address, "processing_mode": PROCESSING_MODE, "workers": len(found)}


def through_service(dataset: tf.data.Dataset, address: str, job_name: str | None = None) -> tf.data.Dataset:
    """`dataset` run on the service's workers. Trainers that share a `job_name` share its passes:
    each batch goes to one of them."""
    batches = dataset.apply(tf.data.experimental.service.distribute(PROCESSING_MODE, address, job_name=job_name))
    return batches.prefetch(AUTOTUNE)


def service_at_end(service: dict | None) -> dict | None:
    """The tf.data service the run used, with the workers it has now (None if it no longer answers)."""
    if service is None:
        return None
    try:
        return {**service, "workers_at_end": len(workers(service["address"]))}
    except ServiceError:
        return {**service, "workers_at_end": None}


# ---------------------------------------------------------------- shards from a bucket TensorFlow cannot read
# On a ROOT TensorFlow cannot open itself (s3://, any fsspec store; components/common/tf_files.py), the
# shards this worker's input pipelines read are staged into the local shard cache before TensorFlow
# starts (components/common/shard_cache.py). What the run writes goes the other way (trainer.py).

def shards_read(train: list[Shard], eval_: list[Shard], workers: int, pipeline: int) -> list[Shard]:
    """The train and eval shards this worker's input pipelines read (components/common/shard_cache.py)."""
    mine = shards_of_worker(train, workers, pipeline, by_file(len(train), workers))
    mine += shards_of_worker(eval_, workers, pipeline, by_file(len(eval_), workers)) if eval_ else []
    if train[0] not in mine:
        mine.insert(0, train[0])  # the input probe samples the first training shard on every worker
    return mine


def stage(cache: ShardCache, train: list[Shard], eval_: list[Shard], workers: int,
          pipeline: int) -> tuple[list[Shard], list[Shard], dict, list[Mismatch]]:
    """The local copies of the train and eval shards, what staging did, and the shards of this worker whose
    copy is not the file their manifest names. Raises CacheError when the cache cannot hold them."""
    mine = shards_read(train, eval_, workers, pipeline)
    staged = cache.stage(mine)
    report = staged.to_json()
    report["selection"] = ("all shards" if len(mine) == len(train) + len(eval_) else
                           f"this worker's {len(mine)} of {len(train) + len(eval_)} shards (its input pipeline "
                           f"reads every {workers}th file, from the {pipeline}th)")
    print(f"stoke train: staged {report['shards']} shards into {cache.folder}: {staged.fetched} copied "
          f"({report['mb_fetched']} MB in {report['seconds']} s), {staged.reused} reused"
          + (f", {len(staged.refetched)} copied again after failing their check" if staged.refetched else ""),
          file=sys.stderr, flush=True)
    return cache.local(train), cache.local(eval_), report, staged.mismatched
