"""Per-record correctness of a SavedModel on the eval shards, for the gate's paired comparison.

TFMA reports aggregates only; McNemar's test and the paired interval need to know, record by record,
whether each model was right. Every model reads the shards in the same order through the same
`examples` signature TFMA uses, and is right when its most probable class is the label (what TFMA's
SparseCategoricalAccuracy counts), so the counts here add up to TFMA's accuracy.
"""
from __future__ import annotations

import dataclasses
import hashlib

from components.contracts import schema

BATCH = 256


@dataclasses.dataclass(frozen=True)
class Answered:
    """A model's class for every eval record, in shard order, beside the record's label and key (answers.py)."""
    keys: list[str]  # SHA-256 of the record's image/encoded
    labels: list[int]
    answers: list[int]


def answered(model_dir: str, shards) -> Answered:
    """The key and label of every eval record and the model's class for it, in shard order."""
    import tensorflow as tf

    predict = tf.saved_model.load(model_dir).signatures[schema.EXAMPLES_SIGNATURE]
    spec = {name: schema.feature_spec()[name] for name in (schema.LABEL, schema.ENCODED)}
    out = Answered([], [], [])
    for shard in shards:
        for batch in tf.data.TFRecordDataset(shard.uri, compression_type=shard.compression).batch(BATCH):
            features = tf.io.parse_example(batch, spec)
            out.keys.extend(hashlib.sha256(encoded).hexdigest() for encoded in features[schema.ENCODED].numpy())
            out.labels.extend(int(v) for v in features[schema.LABEL].numpy())
            probabilities = predict(**{schema.EXAMPLES_INPUT: batch})["probabilities"]
            out.answers.extend(int(v) for v in tf.argmax(probabilities, axis=-1).numpy())
    return out


def pairs(candidate: Answered, versions: dict[int, tuple[str, frozenset[int]]],
          shards) -> dict[int, tuple[list[bool], list[bool], list[int]]]:
    """For each served version (local path, ids of the classes it and the candidate answer), whether the
    candidate and the version are right on each eval record of those classes, and the record's class."""
    labels = candidate.labels
    candidate_right = [answer == label for answer, label in zip(candidate.answers, labels)]
    out = {}
    for version, (path, known) in versions.items():
        served = answered(path, shards).answers
        keep = [i for i, label in enumerate(labels) if label in known]
        out[version] = ([candidate_right[i] for i in keep], [served[i] == labels[i] for i in keep],
                        [labels[i] for i in keep])
    return out
