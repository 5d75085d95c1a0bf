"""Per-record correctness of a SavedModel on the eval shards, for the gate's paired comparison.

TFMA reports aggregates only; McNemar's test and the paired interval need to know, record by record,
whether each model was right. Every model reads the shards in the same order through the same
`examples` signature TFMA uses, and is right when its most probable class is the label (what TFMA's
SparseCategoricalAccuracy counts), so the counts here add up to TFMA's accuracy.
"""
from __future__ import annotations

from components.contracts import schema

BATCH = 256


def labels_and_answers(model_dir: str, shards) -> tuple[list[int], list[int]]:
    """The label of every eval record and the model's class for it, in shard order."""
    import tensorflow as tf

    predict = tf.saved_model.load(model_dir).signatures[schema.EXAMPLES_SIGNATURE]
    spec = {schema.LABEL: schema.feature_spec()[schema.LABEL]}
    labels: list[int] = []
    answers: list[int] = []
    for shard in shards:
        for batch in tf.data.TFRecordDataset(shard.uri, compression_type=shard.compression).batch(BATCH):
            labels.extend(int(v) for v in tf.io.parse_example(batch, spec)[schema.LABEL].numpy())
            probabilities = predict(**{schema.EXAMPLES_INPUT: batch})["probabilities"]
            answers.extend(int(v) for v in tf.argmax(probabilities, axis=-1).numpy())
    return labels, answers


def pairs(candidate: str, versions: dict[int, tuple[str, frozenset[int]]],
          shards) -> dict[int, tuple[list[bool], list[bool], list[int]]]:
    """For each served version (local path, ids of the classes it and the candidate answer), whether the
    candidate and the version are right on each eval record of those classes, and the record's class."""
    labels, answers = labels_and_answers(candidate, shards)
    candidate_right = [answer == label for answer, label in zip(answers, labels)]
    out = {}
    for version, (path, known) in versions.items():
        _, served = labels_and_answers(path, shards)
        keep = [i for i, label in enumerate(labels) if label in known]
        out[version] = ([candidate_right[i] for i in keep], [served[i] == labels[i] for i in keep],
                        [labels[i] for i in keep])
    return out
