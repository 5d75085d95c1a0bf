"""What the data check's label check records about a span (components/datacheck/label_errors.py decides it):
the facts of each suspected label error, and the check's counts, expected rate and test."""
from __future__ import annotations

from typing import Literal

from components.contracts.results import Result


class SuspectedLabel(Result):
    """The facts of a suspected label error: the label a file was given and the one the served model gives it."""

    given: str
    predicted: str
    confidence: float  # the served model's probability of `predicted`
    given_probability: float  # ... and of `given`
    split: str


class LabelPair(Result):
    given: str
    predicted: str
    count: int


class LabelCheck(Result):
    """The label check of one span: the served model's out-of-sample predictions judged by confident learning
    (components/datacheck/label_errors.py), or why it was skipped."""

    status: Literal["done", "skipped"]
    reason: str | None = None  # why skipped
    model: str | None = None  # ROOT/models/<name>/<version> that predicted
    checked: int = 0  # records judged
    unknown: int = 0  # records of classes the model does not know, or that it could not read: not judged
    flagged: int = 0  # suspected label errors
    pairs: list[LabelPair] = []  # flagged records per (given, predicted), most first
    expected_rate: float | None = None  # the rate the test expects: the history's, or the model's eval error
    expected_from: str | None = None  # where expected_rate comes from
    p_value: float | None = None  # one-sided exact binomial test, Bonferroni-adjusted over the tests made
    sheet: str | None = None  # PNG of the first flagged images, titled given -> predicted
    seconds: float | None = None  # reading, predicting and judging the span
