"""The served model's predictions on a span, for the label check: the newest version in ROOT/models/<name>
(components/common/repository.py), when its lineage shows it was not trained on the span, run over every
record of the span in batches through its `serving_default` signature (the same preprocessing as serving
and evaluation). Records are read once, through the checked TFRecord reader; TensorFlow is imported only
when there is a model to run.
"""
from __future__ import annotations

import dataclasses
import tempfile
import time

import numpy as np

from components.common.files import join
from components.common.repository import Repository, RepositoryError
from components.common.tf_files import local_copy
from components.common.tfrecord import BadRecord, shard_records
from components.contracts.layout import Root
from components.contracts.lineage import Lineage
from components.contracts.results import ResultError, SpanManifest
from components.contracts.schema import ENCODED, SERVING_INPUT, SERVING_SIGNATURE, SOURCE, TEXT, example_bytes
from components.datacheck.label_errors import Predictions

BATCH = 64  # images per call: one graph call amortised over many, and a few MB of encoded bytes
KEEP_IMAGES = 256  # encoded images kept for the report's sheet: those the model disagrees with, first first


class UnreadableSpan(Exception):
    """A shard the label check cannot read; the message names it."""


class UnusableModel(Exception):
    """A served version the label check cannot run; the message says why."""


@dataclasses.dataclass(frozen=True)
class Served:
    uri: str  # ROOT/models/<name>/<version>
    lineage: Lineage

    @property
    def error(self) -> float:
        """Its error on its eval split, as the gate measured it."""
        return 1.0 - self.lineage.metrics.accuracy


def served(root: Root, name: str, manifest: SpanManifest) -> Served | str:
    """The served version that may judge the span of `manifest`, or why none may: one trained on it (the
    same number and manifest) has seen its records."""
    span = manifest.span
    try:
        repository = Repository(root, name)
        version = repository.newest()
        lineage = repository.lineage(version) if version is not None else None
    except (RepositoryError, ResultError, OSError) as error:
        return f"the model repository {root.models(name)} cannot be read ({error})"
    if version is None:
        return f"no served model: {root.models(name)} holds no version"
    where = repository.version_uri(version)
    if lineage is None:
        return f"{where} has no lineage, so nothing says it was not trained on span {span}"
    if (span, manifest.sha256) in lineage.trained_on():
        return f"{where} was trained on span {span}: its predictions there are not out-of-sample"
    return Served(where, lineage)


def predict(root: Root, manifest: SpanManifest, model: Served) -> tuple[Predictions, dict[int, bytes], float]:
    """The model's probabilities on every record of the span whose class it answers (not one it keeps an id
    for without a record: it gives that class probability 0), a few encoded images (by row) for the sheet,
    and the seconds it took."""
    import tensorflow as tf

    started = time.monotonic()
    labels = model.lineage.labels
    index = {name: labels.index(name) for name in model.lineage.label_set.answered}
    with tempfile.TemporaryDirectory(prefix="stoke-label-check-") as scratch:
        try:
            signature = tf.saved_model.load(local_copy(model.uri, scratch, "model")).signatures[SERVING_SIGNATURE]
        except Exception as error:  # the loader raises what the damage makes of it: IndexError, DecodeError, OpError...
            raise UnusableModel(f"{model.uri} cannot be loaded ({type(error).__name__}: {str(error)[:200]})") from None
        rows, batch, kept, unknown = [], [], {}, 0
        for record in records(root, manifest):
            if record[2] not in index:
                unknown += 1
                continue
            batch.append(record)
            if len(batch) == BATCH:
                unknown += run_batch(signature, batch, index, len(labels), rows, kept)
                batch = []
        if batch:
            unknown += run_batch(signature, batch, index, len(labels), rows, kept)
    probabilities = np.array([r[3] for r in rows], dtype=np.float64).reshape(len(rows), len(labels))
    found = Predictions(labels=labels, files=[r[0] for r in rows], splits=[r[1] for r in rows],
                        given=np.array([r[2] for r in rows], dtype=int), probabilities=probabilities, unknown=unknown)
    return found, kept, time.monotonic() - started


def records(root: Root, manifest: SpanManifest):
    """(source URI, split, label name, encoded image) of every record of the span, shard by shard."""
    for entry in manifest.shards:
        shard = join(root.span(manifest.span), entry.file)
        try:
            for record in shard_records(shard, manifest.compression):
                features = example_bytes(record)
                yield (features[SOURCE].decode(), entry.split, features[TEXT].decode(), features[ENCODED])
        except (BadRecord, OSError) as error:
            raise UnreadableSpan(f"span {manifest.span}'s shard {shard} cannot be read ({error}); restore the span "
                                 "from a backup, or ingest its files into a new span") from None
        except (ValueError, KeyError) as error:
            raise UnreadableSpan(f"span {manifest.span}'s shard {shard} holds a record that is not one of ingest's "
                                 f"tf.Examples ({error})") from None


def run_batch(signature, batch: list[tuple], index: dict[str, int], classes: int, rows: list,
              kept: dict[int, bytes]) -> int:
    """Appends (file, split, label index, probabilities) per record of `batch` the model reads to `rows`;
    returns how many it could not read (an image refused: the rest of the batch is judged one by one).
    `classes`: how many the lineage names, as many probabilities as the model answers."""
    import tensorflow as tf

    def call(images):
        return signature(**{SERVING_INPUT: tf.constant(images, dtype=tf.string)})["probabilities"].numpy()

    try:
        answers = list(call([r[3] for r in batch]))
    except tf.errors.InvalidArgumentError:
        answers = []
        for record in batch:
            try:
                answers.append(call([record[3]])[0])
            except tf.errors.InvalidArgumentError:
                answers.append(None)
    for (file, split, name, encoded), answer in zip(batch, answers):
        if answer is None:
            continue
        if len(answer) != classes:
            raise UnusableModel(f"the served model answers {len(answer)} probabilities, its lineage names {classes} "
                                "classes")
        if len(kept) < KEEP_IMAGES and int(np.argmax(answer)) != index[name]:
            kept[len(rows)] = encoded
        rows.append((file, split, index[name], answer))
    return sum(answer is None for answer in answers)
