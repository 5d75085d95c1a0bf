"""tf.data from published spans: the input pipeline that keeps the accelerator busy.

Order of work, cheapest first: shuffle shard FILES, interleave GZIP readers in parallel, shuffle the
small encoded records (not decoded images, which are 10-50x larger), then one parallel map that
parses, decodes only what the crop keeps, resizes and flips, then batch with a fixed shape (XLA
compiles one program) and prefetch. Output images are uint8: a quarter of the bytes of float32 to
copy to the device; the model rescales them.

The decode/resize functions are shared with the serving signature (components/train/export.py), so
a served image goes through exactly the evaluation preprocessing.
"""
from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from components.common.program import setting_hint
from components.common.shard_scan import ShardScan
from components.contracts import schema
from components.contracts.layout import Shard
from components.train import eval_batches

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
    image_size: int
    batch_size: int  # per input pipeline (per replica under a strategy)
    training: bool
    # None: no cache; "memory"; or the name of tf.data's file cache, used as given: one bound to what it holds
    # (components/train/image_cache.py names it for the shards, these options and the input pipeline)
    cache: str | None = None
    skip_corrupt: bool = False
    flip: bool = True  # random horizontal flips when training
    shuffle_buffer: int = 2048
    repeat: bool = True  # training only: evaluation reads each record once
    ram_budget_fraction: float = 0.5  # share of physical memory tf.data autotuning may use
    private_threads: int | None = None  # size of a private threadpool; None shares TF's pool
    seed: int | None = None  # fixes file and record shuffles and every crop and flip
    # Evaluation: with a number of batches, (image, label, weight) examples padded to exactly that
    # many with blanks of weight 0; real records weigh eval_weight (components/train/eval_batches.py).
    eval_batches: int | None = None
    eval_weight: float = 1.0
    exclude: tuple[str, ...] = ()  # source URIs of records to leave out (train.drop_suspected_label_errors)


def make_dataset(shards: list[Shard], options: PipelineOptions,
                 input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """(uint8 images [B, S, S, 3], int32 labels [B]) batches from shard files, plus float32 weights [B]
    with `eval_batches`; training repeats the records, evaluation reads each once."""
    if not shards:
        raise ValueError("no shard files to read")
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    records = _records(shards, options, pipelines, pipeline_id)
    cache = options.cache
    if options.training:
        dataset = _decoded(records, options) if cache is None else _decoded_cached(records, options, cache)
        dataset = dataset.repeat() if options.repeat else dataset
    else:
        dataset = _decoded(records, options)
        if cache is not None:  # the decoded records, before any blank: the first blank asked for ends them
            dataset = dataset.cache("" if cache == "memory" else cache)
        if options.eval_batches:
            dataset = eval_batches.padded(dataset, options.eval_batches * options.batch_size, options.eval_weight)
    dataset = dataset.batch(options.batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE,
                            deterministic=_in_order(options))
    dataset = dataset.prefetch(AUTOTUNE)
    return dataset.with_options(_options(options))


def _in_order(options: PipelineOptions) -> bool:
    """Parallel work may finish out of order, which is faster; with a seed, the order is kept."""
    return not options.training or options.seed is not None


def _records(shards: list[Shard], options: PipelineOptions, pipelines: int, pipeline_id: int) -> tf.data.Dataset:
    """This input pipeline's serialized records, files shuffled when training."""
    # Shard by FILE when every worker gets at least one file (no worker reads what it throws
    # away); by DATA otherwise (every worker reads everything and keeps 1/N of the records).
    by_file = eval_batches.by_file(len(shards), pipelines)
    files = tf.data.Dataset.from_tensor_slices(([s.uri for s in shards], [s.compression for s in shards]))
    if by_file:
        files = files.shard(pipelines, pipeline_id)
    if options.training:
        files = files.shuffle(len(shards), seed=options.seed, reshuffle_each_iteration=True)

    def read(uri, compression):
        records = tf.data.TFRecordDataset(uri, compression_type=compression, buffer_size=4 << 20)
        # A bad CRC ends that shard's reading (the reader cannot find the next record boundary);
        # the training report counts the records lost (see components/common/shard_scan.py).
        return records.ignore_errors() if options.skip_corrupt else records

    records = files.interleave(read, cycle_length=min(len(shards), 16), block_length=1,
                               num_parallel_calls=AUTOTUNE, deterministic=_in_order(options))
    if pipelines > 1 and not by_file:
        records = records.shard(pipelines, pipeline_id)
    return without(records, options.exclude) if options.exclude else records


def without(records: tf.data.Dataset, sources: tuple[str, ...]) -> tf.data.Dataset:
    """The serialized records whose image/source is none of `sources`: each source's 64-bit fingerprint
    searched in the sorted fingerprints of those left out. Plain ops, no lookup table, so the filter runs
    wherever the pipeline does (tf.data service workers too); two URIs share a fingerprint about once in 2^63."""
    keys = tf.sort(tf.unique(tf.strings.to_hash_bucket_fast(tf.constant(list(sources)), 2**63 - 1)).y)
    spec = {schema.SOURCE: schema.feature_spec()[schema.SOURCE]}

    def kept(serialized):
        key = tf.strings.to_hash_bucket_fast(tf.io.parse_single_example(serialized, spec)[schema.SOURCE], 2**63 - 1)
        at = tf.minimum(tf.searchsorted(keys, tf.reshape(key, [1]))[0], tf.size(keys, out_type=tf.int32) - 1)
        return tf.not_equal(keys[at], key)

    return records.filter(kept)


def _decoded(records: tf.data.Dataset, options: PipelineOptions) -> tf.data.Dataset:
    """(image, label) from each record: cropped and flipped at random when training, whole otherwise."""
    size = options.image_size
    if not options.training:
        def decode(serialized):
            encoded, label = parse(serialized)
            return decode_eval(encoded, size), label

        return records.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)

    records = _with_seeds(records.shuffle(options.shuffle_buffer, seed=options.seed), options.seed)

    def decode_random(serialized, seed):
        encoded, label = parse(serialized)
        return decode_train(encoded, size, options.flip, seed), label

    return records.map(decode_random, num_parallel_calls=AUTOTUNE, deterministic=_in_order(options))


def _decoded_cached(records: tf.data.Dataset, options: PipelineOptions, cache: str) -> tf.data.Dataset:
    """Training's _decoded, with decoded full images cached; crops and flips stay random on every epoch."""
    size = options.image_size
    in_order = _in_order(options)

    def decode_full(serialized):
        encoded, label = parse(serialized)
        image = tf.cond(tf.io.is_jpeg(encoded), lambda: _decode_jpeg(encoded, size),
                        lambda: _decode_other(encoded))
        return image, label

    dataset = records.map(decode_full, num_parallel_calls=AUTOTUNE, deterministic=in_order)
    dataset = dataset.cache("" if cache == "memory" else cache)
    dataset = _with_seeds(dataset.shuffle(options.shuffle_buffer, seed=options.seed), options.seed)

    def augment(decoded, seed):
        image, label = decoded
        return augment_decoded(image, size, seed, options.flip), label

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


# ---------------------------------------------------------------- what the spans hold

def stored_images(shards: list[Shard], image_size: int, sample: int = 256) -> dict:
    """From the first records of one shard: the median shorter side stored, the share of JPEGs and
    the size of the whole split decoded as `image_cache` holds it (JPEG at its DCT ratio), in GB."""
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
