"""The tf.data pipeline from spans: decode ops eagerly and inside tf.data, sharding, corrupt shards."""
from __future__ import annotations

import gzip
import io
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from components.common.shard_scan import scan_shards
from components.common.span_labels import label_set
from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.contracts.layout import Root
from components.train import data as pipeline


def _jpeg(height: int, width: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    # Smooth gradients plus mild noise: decodes like a photo, not like white noise.
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    pixels = np.clip(pixels + rng.integers(-8, 8, pixels.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


def _png(height: int, width: int) -> bytes:
    pixels = np.random.default_rng(1).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _in_dataset(fn, *args):
    """Runs fn inside a tf.data map (graph mode, tf.data's threads) and returns its one result."""
    dataset = tf.data.Dataset.from_tensors(tuple(tf.constant(a) for a in args)).map(fn)
    return next(iter(dataset)).numpy()


def test_list_shards_reads_only_published_spans(small_spans_root):
    root = Root(small_spans_root)
    train = Spans(root).shards("train")
    assert [s.span for s in train] == [1, 1, 1]  # span 2 has no manifest
    assert sum(s.records for s in train) == 48
    assert {s.compression for s in train} == {"GZIP"}
    assert Spans(root).shards("train", [2]) == []
    assert label_set(root).labels == ["red", "green", "blue"]


def test_parse_is_identical_eagerly_and_inside_tf_data(small_spans_root):
    shard = Spans(small_spans_root).shards("eval")[0]
    record = next(iter(tf.data.TFRecordDataset(shard.uri, "GZIP"))).numpy()
    encoded, label = pipeline.parse(tf.constant(record))
    inside = next(iter(tf.data.Dataset.from_tensors(record).map(pipeline.parse)))
    assert encoded.numpy() == inside[0].numpy()
    assert encoded.numpy()[:3] == b"\xff\xd8\xff" or encoded.numpy()[:4] == b"\x89PNG"
    assert label.dtype == tf.int32 and int(label) == int(inside[1])


@pytest.mark.parametrize("height, width, size, ratio", [
    (240, 320, 224, 1), (100, 90, 45, 2), (130, 260, 32, 4), (512, 300, 32, 8)])
def test_jpeg_ratio_keeps_both_sides_at_least_the_target(height, width, size, ratio):
    index = int(pipeline.jpeg_ratio(tf.constant(height), tf.constant(width), size))
    assert pipeline.JPEG_RATIOS[index] == ratio


@pytest.mark.parametrize("encoded", [_jpeg(130, 170), _png(40, 50)], ids=["jpeg", "png"])
def test_decode_eval_is_identical_eagerly_and_inside_tf_data(encoded):
    eager = pipeline.decode_eval(tf.constant(encoded), 32).numpy()
    inside = _in_dataset(lambda b: pipeline.decode_eval(b, 32), encoded)
    assert eager.shape == (32, 32, 3) and eager.dtype == np.uint8
    np.testing.assert_array_equal(eager, inside)


@pytest.mark.parametrize("encoded", [_jpeg(130, 170), _png(40, 50)], ids=["jpeg", "png"])
def test_decode_train_is_identical_eagerly_and_inside_tf_data(encoded):
    seed = np.array([3, 5], np.int32)  # stateless crop and flip: the same seed, the same image
    eager = pipeline.decode_train(tf.constant(encoded), 16, seed=tf.constant(seed)).numpy()
    inside = _in_dataset(lambda b, s: pipeline.decode_train(b, 16, seed=s), encoded, seed)
    np.testing.assert_array_equal(eager, inside)


def test_dct_downscaled_decode_matches_a_full_decode():
    encoded = _jpeg(256, 320)
    fast = pipeline.decode_eval(tf.constant(encoded), 32).numpy().astype(int)  # ratio 8
    full = tf.image.resize(tf.io.decode_jpeg(encoded), [32, 32], antialias=True).numpy()
    assert np.abs(fast - full).mean() < 6  # same picture; DCT scaling is a box filter


@pytest.mark.parametrize("size", [64, 16], ids=["full-scale", "dct-ratio-4"])
def test_crop_decode_matches_decode_then_crop(size):
    """decode_train decodes only the crop window of a JPEG, at a DCT ratio when the window allows."""
    encoded = _jpeg(120, 160)
    seed = tf.constant([0, 7])
    cropped = pipeline.decode_train(tf.constant(encoded), size, flip=False, seed=seed).numpy().astype(int)
    crop_seed, _ = tf.unstack(tf.random.experimental.stateless_split(seed, 2))  # as decode_train splits it
    y, x, h, w = pipeline.random_crop_window(tf.constant([120, 160]), crop_seed).numpy()
    assert pipeline.JPEG_RATIOS[int(pipeline.jpeg_ratio(h, w, size))] == (1 if size == 64 else 4)
    reference = tf.image.resize(tf.image.crop_to_bounding_box(tf.io.decode_jpeg(encoded), y, x, h, w),
                                [size, size], antialias=True)
    assert np.abs(cropped - reference.numpy()).mean() < 3


def _collect(dataset) -> tuple[list[bytes], list[int]]:
    images, labels = [], []
    for batch_images, batch_labels in dataset:
        images += [image.tobytes() for image in batch_images.numpy()]
        labels += batch_labels.numpy().tolist()
    return images, labels


def _eval_options(batch_size=4, **kw):
    return pipeline.PipelineOptions(batch_size=batch_size, training=False, repeat=False, **kw)


def _settings(image_size=16, **kw) -> TrainConfig:
    return TrainConfig(image_size=image_size, flip=True, **kw)


def test_training_batches_have_static_shapes(small_spans_root):
    shards = Spans(small_spans_root).shards("train")
    options = pipeline.PipelineOptions(batch_size=5, training=True, seed=1)
    dataset = pipeline.make_dataset(shards, _settings(24, shuffle_buffer=16), options)
    assert dataset.element_spec[0].shape.as_list() == [5, 24, 24, 3]
    assert dataset.element_spec[0].dtype == tf.uint8
    images, labels = next(iter(dataset.take(20).skip(19)))  # repeats past one pass of 48
    assert images.shape == (5, 24, 24, 3) and set(labels.numpy()) <= {0, 1, 2}


def test_no_flip_keeps_the_orientation():
    encoded = tf.constant(_jpeg(40, 40))
    images = [pipeline.decode_train(encoded, 40, flip=False) for _ in range(8)]
    # Crops vary, but without flips the left half stays darker (the red ramp rises to the right).
    assert all(float(tf.reduce_mean(tf.cast(i[:, :20, 0], tf.float32))) <
               float(tf.reduce_mean(tf.cast(i[:, 20:, 0], tf.float32))) for i in images)
    flipped = [pipeline.decode_train(encoded, 40) for _ in range(40)]
    assert any(float(tf.reduce_mean(tf.cast(i[:, :20, 0], tf.float32))) >
               float(tf.reduce_mean(tf.cast(i[:, 20:, 0], tf.float32))) for i in flipped)


def test_eval_pipeline_is_deterministic_and_complete(small_spans_root):
    shards = Spans(small_spans_root).shards("train")
    first = _collect(pipeline.make_dataset(shards, _settings(), _eval_options()))
    second = _collect(pipeline.make_dataset(shards, _settings(), _eval_options()))
    assert first == second
    assert len(first[0]) == 48 and sorted(first[1]) == sorted([i % 3 for i in range(48)])


def test_memory_cache_keeps_every_record(small_spans_root):
    shards = Spans(small_spans_root).shards("train")
    cached = pipeline.make_dataset(shards, _settings(), _eval_options(cache="memory"))
    assert _collect(cached) == _collect(pipeline.make_dataset(shards, _settings(), _eval_options()))
    training = pipeline.PipelineOptions(batch_size=8, training=True, cache="memory")
    images, _ = next(iter(pipeline.make_dataset(shards, _settings(), training)))
    assert images.shape == (8, 16, 16, 3)


@pytest.mark.parametrize("split", ["train", "eval"])  # 3 shards: by file; 1 shard: by record
def test_two_workers_read_disjoint_halves_that_cover_the_split(small_spans_root, split):
    shards = Spans(small_spans_root).shards(split)
    parts = [_collect(pipeline.make_dataset(shards, _settings(), _eval_options(batch_size=1),
                                            tf.distribute.InputContext(2, worker, 1)))[0]
             for worker in (0, 1)]
    whole = _collect(pipeline.make_dataset(shards, _settings(), _eval_options(batch_size=1)))[0]
    assert parts[0] and parts[1]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(whole)


def corrupt_record(path: str, index: int) -> None:
    """Flips one payload byte of record `index` in a GZIP TFRecord file: its data CRC fails."""
    raw = bytearray(gzip.decompress(open(path, "rb").read()))
    offset = 0
    for _ in range(index):
        length = int.from_bytes(raw[offset:offset + 8], "little")
        offset += 8 + 4 + length + 4
    raw[offset + 12 + 10] ^= 0xFF
    with open(path, "wb") as f:
        f.write(gzip.compress(bytes(raw)))


@pytest.fixture(scope="module")
def corrupt_spans_root(small_spans_root, tmp_path_factory):
    """A copy of small_spans_root whose second train shard breaks at its 6th record (of 16)."""
    root = str(tmp_path_factory.mktemp("corrupt-root") / "root")
    shutil.copytree(small_spans_root, root)
    corrupt_record(Spans(root).shards("train")[1].uri, 5)
    return root


def test_scan_names_the_corrupt_shard_and_counts_lost_records(corrupt_spans_root):
    scans = scan_shards(Spans(corrupt_spans_root).shards("train"))
    assert [s.error is not None for s in scans] == [False, True, False]
    bad = scans[1]
    assert bad.uri.endswith("train-00001-of-00003.tfrecord.gz")
    assert (bad.readable, bad.lost) == (5, 11)
    assert "corrupted record" in bad.error
    assert "train-00001-of-00003" in str(pipeline.CorruptShardError([bad]))


def test_corrupt_shard_fails_reading_unless_skipped(corrupt_spans_root):
    shards = Spans(corrupt_spans_root).shards("train")
    with pytest.raises(tf.errors.DataLossError):
        _collect(pipeline.make_dataset(shards, _settings(), _eval_options()))
    images, _ = _collect(pipeline.make_dataset(shards, _settings(skip_corrupt=True), _eval_options(batch_size=1)))
    assert len(images) == 48 - 11


def test_bench_input_reports_every_rate(tmp_path, capsys):
    from benchmarks import input_pipeline as bench_input
    from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span

    records = tiny_records(24)
    for index, (encoded, image_format, label) in enumerate(records):
        path = tmp_path / "source" / TRAIN_LABELS[label] / f"{index:03d}.{'jpg' if image_format == 'jpeg' else 'png'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded)
    root = str(tmp_path / "root")
    # As ingest leaves it: measuring speed needs no data check to have let the span in first.
    write_span(root, 1, {"train": records}, TRAIN_LABELS, {"train": 2}, checked=False)
    argv = [str(tmp_path / "source"), "--root", root, "--image-size", "16", "--batch-size", "4",
            "--batches", "2", "--rounds", "1", "--json"]
    assert bench_input.run(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("stoke", "keras_from_directory", "naive", "limit"):
        assert result[f"{key}_images_per_sec"] > 0, key
    assert result["stoke_vs_keras"] == result["stoke_images_per_sec"] / result["keras_from_directory_images_per_sec"]

    assert bench_input.run([str(tmp_path / "source"), "--root", str(tmp_path / "empty"), "--json"]) == 1
    assert "stoke ingest" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


# ---------------------------------------------------------------- oversized images (serving)

def _encoded(fmt: str, width: int, height: int, **options) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 60)).save(buffer, format=fmt, **options)
    return buffer.getvalue()


FORMATS = {"jpeg": ("JPEG", {}), "png": ("PNG", {}), "gif": ("GIF", {}), "bmp": ("BMP", {}),
           "webp-lossy": ("WEBP", {}), "webp-lossless": ("WEBP", {"lossless": True})}


def _png_declaring(width: int, height: int) -> bytes:
    from tests.beam_jobs.images import png_declaring
    return png_declaring(width, height)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_header_pixels_reads_each_format_without_decoding(name):
    fmt, options = FORMATS[name]
    encoded = _encoded(fmt, 300, 70, **options)
    assert int(pipeline.header_pixels(tf.constant(encoded))) == 300 * 70  # eager
    in_data = tf.data.Dataset.from_tensors(encoded).map(pipeline.header_pixels)
    assert int(next(iter(in_data))) == 300 * 70  # inside tf.data
    assert int(pipeline.header_pixels(tf.constant(b"not an image"))) == 0


def test_serving_decode_refuses_images_over_the_cap_before_decoding():
    bomb = tf.constant(_png_declaring(13000, 13000))
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than 50 megapixels"):
        pipeline.decode_eval(bomb, 32, max_pixels=50_000_000)  # eager: 507 MB of pixels never allocated
    dataset = tf.data.Dataset.from_tensors(bomb).map(lambda b: pipeline.decode_eval(b, 32, max_pixels=50_000_000))
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than 50 megapixels"):
        next(iter(dataset))
    wide = tf.constant(_encoded("JPEG", 1200, 100))
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than 0.1 megapixels"):
        pipeline.decode_eval(wide, 32, max_pixels=100_000)
    assert pipeline.decode_eval(wide, 32, max_pixels=120_000).shape == (32, 32, 3)


def test_records_left_out_by_span_and_source_are_missing_from_training_and_only_they(small_spans_root):
    """train.drop_suspected_label_errors and the history a warm run does not replay: the records named (by
    span and image/source) are left out, in the training pipeline, and a name no record has takes nothing
    with it, nor does a source named in another span (a file rewritten in place is in two spans)."""
    shards = Spans(small_spans_root).shards("train")  # span 1; shard s holds the 16 records of label s
    gone = ((1, "mem://train/0/0"), (1, "mem://train/0/15"), (1, "mem://train/2/5"), (1, "mem://train/9/9"),
            (2, "mem://train/1/3"), (11, "mem://train/1/4"))
    options = pipeline.PipelineOptions(batch_size=1, training=True, repeat=False, seed=3, exclude=gone)
    labels = sorted(int(label) for _, batch in pipeline.make_dataset(shards, _settings(), options)
                    for label in batch.numpy())
    assert labels == [0] * 14 + [1] * 16 + [2] * 15
    everything = pipeline.PipelineOptions(batch_size=1, training=True, repeat=False, seed=3)
    assert sum(1 for _ in pipeline.make_dataset(shards, _settings(), everything)) == 48
