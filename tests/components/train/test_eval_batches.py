"""Evaluation batches: every eval record once, weighted, then blanks of weight 0, in whole batches."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.train import data
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span

SIXTEEN = TrainConfig(image_size=16)


@pytest.mark.parametrize("counts, pipelines, expected", [
    ([19], 1, [19]),
    ([19], 2, [10, 9]),  # one file: by record, round robin
    ([7, 6, 6], 2, [13, 6]),  # by file: 0 and 2, then 1
    ([5, 5, 5, 5], 3, [10, 5, 5]),
])
def test_each_pipeline_reads_its_share_of_the_records(counts, pipelines, expected):
    assert data.pipeline_records(counts, pipelines) == expected


def test_steps_cover_the_longest_share_on_every_worker():
    assert data.eval_steps([19], 1, 8) == 3
    assert data.eval_steps([7, 6, 6], 2, 16) == 2  # 13 records in batches of 8 on worker 0
    assert data.eval_steps([16], 1, 8) == 2
    assert data.eval_steps([], 1, 8) == data.eval_steps([0], 2, 8) == 0
    assert data.record_weight(19, 3, 8) == 24 / 19


@pytest.fixture(scope="module")
def uneven_eval_shards(tmp_path_factory):
    """19 eval records in 3 files of 7, 6 and 6: two workers read 13 and 6 of them."""
    root = str(tmp_path_factory.mktemp("eval-batches"))
    write_span(root, 1, {"train": tiny_records(4), "eval": tiny_records(19, offset=1000)},
               TRAIN_LABELS, {"train": 1, "eval": 3})
    return Spans(root).shards("eval")


def _batches(shards, pipelines: int, pipeline_id: int, cache=None):
    steps = data.eval_steps([s.records for s in shards], pipelines, 8 * pipelines)
    options = data.PipelineOptions(batch_size=8, training=False, cache=cache, eval_batches=steps,
                                   eval_weight=data.record_weight(19, steps, 8 * pipelines))
    dataset = data.make_dataset(shards, SIXTEEN, options, tf.distribute.InputContext(pipelines, pipeline_id, pipelines))
    assert [spec.shape.as_list() for spec in dataset.element_spec] == [[8, 16, 16, 3], [8], [8]]
    return steps, [tuple(part.numpy() for part in batch) for batch in dataset]


@pytest.mark.parametrize("cache", [None, "memory"])
def test_every_record_weighs_once_and_blanks_fill_whole_batches(uneven_eval_shards, cache):
    unpadded = data.PipelineOptions(batch_size=1, training=False)
    every = sorted(image.tobytes() for batch, _ in data.make_dataset(uneven_eval_shards, SIXTEEN, unpadded).as_numpy_iterator()
                   for image in batch)
    seen = []
    for worker, records in ((0, 13), (1, 6)):
        steps, batches = _batches(uneven_eval_shards, 2, worker, cache)
        assert steps == 2 and len(batches) == steps  # worker 1: one batch of blanks only
        images, labels, weights = (np.concatenate(part) for part in zip(*batches))
        weight = 2 * 16 / 19  # predictions made over records evaluated
        np.testing.assert_allclose(weights[:records], weight)
        assert not weights[records:].any() and not images[records:].any() and not labels[records:].any()
        seen += [image.tobytes() for image in images[:records]]
    assert sorted(seen) == every


def test_one_pipeline_pads_the_last_batch_and_stops(uneven_eval_shards):
    steps, batches = _batches(uneven_eval_shards, 1, 0)
    weights = np.concatenate([batch[2] for batch in batches])
    assert steps == 3 and len(weights) == 24
    assert weights.sum() == pytest.approx(24) and (weights > 0).sum() == 19
