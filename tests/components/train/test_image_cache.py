"""train.image_cache on disk is bound to what it holds: another ROOT, a span added, another image size never
read a cache made for other data; a cache a killed run half-wrote is made again; two runs never write one
cache; what stays on disk is one cache per prefix and split."""
from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from pydantic import ValidationError

from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.contracts.layout import Root
from components.train import data, trainer
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span

BATCH = 8


def _settings(cache: str, image_size: int = 32, **changes) -> TrainConfig:
    return TrainConfig(**{"image_size": image_size, "image_cache": cache, "flip": False, "seed": 1, **changes})


def _plan(eval_records: int = 0):
    return types.SimpleNamespace(data_service=None, global_batch=BATCH, excluded=(), eval_records=eval_records,
                                 validation_steps=-(-eval_records // BATCH))


def _labels(root: str, cache: str, records: int) -> list[int]:
    """The labels of one pass over the training split, as the trainer's input reads it with `cache`."""
    make = trainer.dataset_fn(_settings(cache), _plan(), Spans(root).shards("train"), True)
    dataset = make(tf.distribute.InputContext())
    return [int(v) for _, labels in dataset.take(records // BATCH) for v in labels.numpy()]


def _relabelled(records):
    return [(encoded, image_format, 0) for encoded, image_format, _ in records]


def test_another_root_never_reads_this_ones_cache(small_spans_root, tmp_path):
    """ROOT B holds ROOT A's images, every one labelled 0: trained with A's cache path, it reads its own records."""
    cache = str(tmp_path / "images")
    other = str(tmp_path / "other")
    write_span(other, 1, {"train": _relabelled(tiny_records(48)), "eval": tiny_records(19, offset=1000)},
               TRAIN_LABELS, {"train": 3, "eval": 1})
    first = _labels(small_spans_root, cache, 48)
    assert sorted(set(first)) == [0, 1, 2]
    assert _labels(other, cache, 48) == [0] * 48
    assert sorted(_labels(small_spans_root, cache, 48)) == sorted(first)  # A's again: its cache made anew


def test_a_span_added_is_read_with_the_others(small_spans_root, tmp_path):
    root = str(tmp_path / "root")
    shutil.copytree(small_spans_root, root, ignore=shutil.ignore_patterns("runs"))
    shutil.rmtree(Root(root).span(2))
    cache = str(tmp_path / "images")
    assert _labels(root, cache, 48).count(0) == 16
    write_span(root, 2, {"train": _relabelled(tiny_records(24, offset=3000))}, TRAIN_LABELS, {"train": 1})
    assert _labels(root, cache, 72).count(0) == 16 + 24  # one pass over both spans, not 1.5 over the first


def test_another_image_size_is_another_cache(small_spans_root, tmp_path):
    """Evaluation caches images resized: read at 24 px after 16, they are 24 px."""
    cache = str(tmp_path / "images")

    def images(size: int):
        make = trainer.dataset_fn(_settings(cache, size), _plan(19), Spans(small_spans_root).shards("eval"), False)
        return [batch[0].numpy() for batch in make(tf.distribute.InputContext()).take(3)]

    assert images(16)[0].shape == (BATCH, 16, 16, 3)
    assert images(24)[0].shape == (BATCH, 24, 24, 3)
    assert images(16)[0].shape == (BATCH, 16, 16, 3)


KILLED_WRITER = """
import os, sys, types
import tensorflow as tf
from components.common.spans import Spans
from components.train import trainer
from components.contracts.config import TrainConfig
settings = TrainConfig(image_size=32, image_cache=sys.argv[2], flip=False, shuffle_buffer=1, seed=1)
plan = types.SimpleNamespace(data_service=None, global_batch=8, excluded=(), eval_records=0, validation_steps=0)
dataset = trainer.dataset_fn(settings, plan, Spans(sys.argv[1]).shards("train"), True)(tf.distribute.InputContext())
records = iter(dataset)  # kept: an iterator dropped before the end discards what it cached
next(records)  # a few records into the cache, which tf.data has not finished
print(sorted(os.listdir(os.path.dirname(sys.argv[2]))), flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_cache_half_written_by_a_killed_run_is_made_again(small_spans_root, tmp_path):
    """tf.data leaves its lockfile behind a killed writer and refuses every later run on it; the next run finds
    the killed run's lock free, removes what it left and writes the cache again."""
    cache = str(tmp_path / "images")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, small_spans_root, cache], capture_output=True,
                            text=True, env=env, timeout=240)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert ".lockfile" in killed.stdout  # what tf.data leaves
    labels = _labels(small_spans_root, cache, 48)
    assert sorted(labels) == sorted(tiny[2] for tiny in tiny_records(48))
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".lockfile") or ".tempstate" in name]


# ---------------------------------------------------------------- the key and the lock, without TensorFlow's pipeline

def _options(**changes) -> data.PipelineOptions:
    return data.PipelineOptions(**{"batch_size": BATCH, "training": True, **changes})


def _key(shards, settings: dict | None = None, context=None, **changes) -> str:
    return data.cache_key(shards, TrainConfig(**{"image_size": 32, **(settings or {})}), _options(**changes), context)


def test_the_key_changes_with_everything_that_changes_what_is_cached(small_spans_root):
    shards = Spans(small_spans_root).shards("train")
    base = _key(shards)
    assert _key(list(shards), {"flip": False, "seed": 7, "shuffle_buffer": 1}, seed=7, cache="x") == base
    variants = {
        "another ROOT's shards": _key([dataclasses.replace(shards[0], sha256="0" * 64), *shards[1:]]),
        "a span added": _key([*shards, dataclasses.replace(shards[0], span=2, sha256="1" * 64)]),
        "a shard fewer": _key(shards[:2]),
        "another image size": _key(shards, {"image_size": 24}),
        "evaluation's preprocessing": _key(shards, training=False),
        "records left out": _key(shards, exclude=((1, "mem://train/0/0"),)),
        "records left out of another span": _key(shards, exclude=((2, "mem://train/0/0"),)),
        "corrupt records skipped": _key(shards, {"skip_corrupt": True}),
        "another input pipeline": _key(shards, context=tf.distribute.InputContext(2, 1, 1)),
    }
    assert base not in variants.values() and len(set(variants.values())) == len(variants), variants


def _plant(path: str) -> str:
    with open(path, "w") as f:
        f.write("x")
    return path


def test_claiming_a_cache_removes_the_splits_others_no_run_uses(tmp_path):
    prefix = str(tmp_path / "images")
    old = [_plant(f"{prefix}-train-{'a' * 16}{suffix}") for suffix in (".index", ".data-00000-of-00001", ".lock")]
    unkeyed = [_plant(f"{prefix}-train{suffix}") for suffix in (".index", "-0.data-00000-of-00001", "_0.lockfile")]
    in_use = f"{prefix}-train-{'b' * 16}"
    busy = [_plant(in_use + ".index"), _plant(in_use + ".data-00000-of-00001")]
    eval_cache = _plant(f"{prefix}-eval-{'c' * 16}.index")
    theirs = [_plant(str(tmp_path / name)) for name in ("images-train.csv", "images-other.index", "notes.txt")]
    held = os.open(in_use + ".lock", os.O_RDWR | os.O_CREAT)  # another run reads it now
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        name = data.claim_cache(prefix, "train", "d" * 16)
    finally:
        os.close(held)
    assert name == f"{prefix}-train-{'d' * 16}" and os.path.exists(name + ".lock")
    assert not any(map(os.path.exists, old + unkeyed))
    assert all(map(os.path.exists, busy + [eval_cache] + theirs))


def test_a_cache_another_run_holds_is_not_written_twice(tmp_path, capsys):
    prefix = str(tmp_path / "images")
    name = f"{prefix}-train-{'e' * 16}"
    held = os.open(name + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert data.claim_cache(prefix, "train", "e" * 16) is None
    finally:
        os.close(held)
    assert "another run is using the image cache" in capsys.readouterr().err
    assert data.claim_cache(prefix, "train", "e" * 16) == name  # free again: this run's, for its life


def test_a_complete_cache_is_kept_and_a_half_written_one_removed(tmp_path):
    prefix = str(tmp_path / "images")
    done = f"{prefix}-train-{'1' * 16}"
    kept = [_plant(done + ".index"), _plant(done + ".data-00000-of-00001")]
    assert data.claim_cache(prefix, "train", "1" * 16) == done and all(map(os.path.exists, kept))
    half = f"{prefix}-eval-{'2' * 16}"
    left = [_plant(half + "_0.lockfile"), _plant(half + "_0.data-00000-of-00001.tempstate123")]
    assert data.claim_cache(prefix, "eval", "2" * 16) == half and not any(map(os.path.exists, left))
    elsewhere = str(tmp_path / "new" / "images")  # tf.data makes no folder: the claim does
    assert data.claim_cache(elsewhere, "eval", "2" * 16) and os.path.isdir(tmp_path / "new")


@pytest.mark.parametrize("prefix", ["s3://bucket/images", "gs://bucket/images", "file:///tmp/images"])
def test_a_cache_prefix_that_is_not_a_local_path_is_refused_as_a_setting(prefix):
    with pytest.raises(ValidationError, match="not a local path"):
        TrainConfig(image_cache=prefix)
    assert TrainConfig(image_cache="memory").image_cache == "memory"
    assert TrainConfig(image_cache="/tmp/images").image_cache == "/tmp/images"


def test_memory_and_no_cache_are_as_before(small_spans_root):
    make = trainer.dataset_fn(_settings("memory"), _plan(), Spans(small_spans_root).shards("train"), True)
    labels = [v for _, batch in make(tf.distribute.InputContext()).take(6) for v in batch.numpy()]
    assert sorted(labels) == sorted(np.array([r[2] for r in tiny_records(48)]))
