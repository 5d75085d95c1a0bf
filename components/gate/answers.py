"""What a model answered for each eval record, recorded once at its gate and kept beside its version.

The gate records the class the candidate answers for every eval record it is judged on (the run's
answers.json.gz); the push copies the record into the version (assets.extra/stoke_answers.json.gz). A
later gate holds its candidate class by class to the reference's recorded answers (reference.py), on
the records both answered, without loading that version again, and after the repository has
retired it.

A record is known by the SHA-256 of its `image/encoded` bytes. The model's answer is a function of
those bytes alone, so the key holds whichever span, shard or position the record is read from, and
two copies of one image share one answer. Each answer is kept with the label the record had: a
record relabelled since asks another question, and is not compared. Pure: lists in, lists out.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Sequence

from components.contracts.results import Answers, ResultError, parse_json


def record(keys: Sequence[str], labels: Sequence[int], answers: Sequence[int], classes: Sequence[str]) -> Answers:
    """The record of a model's `answers` to the records `keys` labelled `labels` (class ids into `classes`)."""
    if not len(keys) == len(labels) == len(answers):
        raise ValueError(f"per-record lists differ in length: {len(keys)}, {len(labels)} and {len(answers)}")
    return Answers(labels=list(classes),
                   records={key: (int(label), int(answer)) for key, label, answer in zip(keys, labels, answers)})


def encode(answers: Answers) -> bytes:
    """The record as its file holds it: compact JSON, gzipped (about 43 bytes an eval record: SHA-256 keys do
    not compress, so the fastest level is as small as the slowest within 4%, at a quarter of the time)."""
    return gzip.compress(json.dumps(answers.to_json(), separators=(",", ":")).encode(), compresslevel=1, mtime=0)


def decode(data: bytes, uri: str) -> Answers:
    """The record in the bytes of the file at `uri`; a file that is not one is a ResultError naming it."""
    try:
        text = gzip.decompress(data)
    except (OSError, EOFError) as error:
        raise ResultError(f"{uri} is not gzip: {error}") from None
    return Answers.check(parse_json(text, uri), uri)


def paired(recorded: Answers, keys: Sequence[str], labels: Sequence[int],
           answers: Sequence[int]) -> tuple[list[bool], list[bool], list[int]]:
    """(candidate right, recorded model right, class id) on the records both answered under the same label,
    for a candidate whose `answers` to the records `keys` labelled `labels` are given: the records of
    the recorded model answered when it was gated, and not relabelled since."""
    candidate, earlier, classes = [], [], []
    for key, label, answer in zip(keys, labels, answers):
        then = recorded.records.get(key)
        if then is None or then[0] != label:
            continue
        candidate.append(answer == label)
        earlier.append(then[1] == label)
        classes.append(label)
    return candidate, earlier, classes
