"""The typed results stages hand each other through ROOT: the span manifest, a run's metrics.json and
gate.json. What a push leaves (pushed.json, a version's lineage) is in lineage.py; the stage programs' own
summaries, the run report and progress events are in summaries.py, all on the same base.

Each is written and read through its model (components/common/files.py: `write_json(uri, result.to_json())`,
`read_result(uri, Model)`; nothing here does I/O). Keys are strict both ways: a missing key fails, and so does an unknown
one, so a key renamed on one side fails loudly in a test instead of turning into None in a report.
"""
from __future__ import annotations

import json
import logging
import typing
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from components.contracts.label_set import LabelSet


class ResultError(ValueError):
    """A result file that is not what its model says; the message names the file."""


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    @classmethod
    def check(cls, data, uri: str):
        """The model from JSON data read from `uri` (components/common/files.py read_result); errors name `uri`."""
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise ResultError(f"{uri} is not a valid {cls.__name__}: {_problems(error)}") from None

    def to_json(self) -> dict:
        """The plain JSON object, as written to the file and printed as a stage's summary."""
        return self.model_dump(mode="json")

    def in_words(self) -> str:
        """A stage's result in one line: its section of the report, when the report has none of its own for it."""
        return (type(self).__doc__ or type(self).__name__).strip().split("\n")[0]

    def log_lines(self) -> list[tuple[int, str]]:
        """What the flow logs of a stage's result, (logging level, line); those at WARNING are its warnings."""
        return []


def parse_json(data: bytes, uri: str):
    """The JSON value in `data`, the bytes of the file at `uri`. Bytes that are not one (not UTF-8, not JSON,
    nested deeper than Python's parser goes) are a ResultError naming the file: every reader of ROOT's files ends
    in one line, not a traceback."""
    try:
        return json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as error:
        raise ResultError(f"{uri} is not JSON: {error}") from None
    except UnicodeDecodeError:
        raise ResultError(f"{uri} is not UTF-8 text, so it is not JSON") from None
    except RecursionError:
        raise ResultError(f"{uri} is nested too deep to be one of Stoke's files") from None


def _problems(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in error.errors()[:5])


# ---------------------------------------------------------------- a span


class SpanCounts(Result):
    train: int
    eval: int
    dead_letter: int  # every line of dead_letter.jsonl, duplicates included
    duplicates: int  # dead letters copying a published image or another of the arrival, not bad files


class LabelConflict(Result):
    """A duplicate whose copy carries another label: kept out, and a question for the data check."""

    uri: str
    label: str
    duplicate_of: str
    other_label: str
    other_span: int | None = None  # None: the copy is in this span


class Anomaly(Result):
    """Something in a span a later check should look at: how many, and the first examples."""

    kind: Literal["label_conflict"]
    count: int
    examples: list[LabelConflict]


QualityIssue = Literal["blurry", "dark", "light", "low_information", "odd_aspect_ratio", "odd_size", "grayscale"]
QUALITY_ISSUES: tuple[str, ...] = typing.get_args(QualityIssue)


class QualityFinding(Result):
    """Records ingest kept with an image-quality issue (beam_jobs/quality.py): how many, the first
    few, and the folders most of them came from; the data check reports them."""

    kind: QualityIssue
    count: int
    examples: list[str]  # the first URIs
    folders: dict[str, int] = {}  # folder -> records, the fullest first


class SamePicture(Result):
    """The most files of an arrival that ingest judged to be one picture: exact copies (one SHA-256) and near-copies
    (within ingest.near_copy_bits of dHash) whose block colours agree too, so that frames of a fixed camera that
    dHash's 9x8 thumbnail cannot tell apart are so many pictures; the data check's same_image_flood reads it."""

    count: int  # files of the largest such group: its records, and the copies of them ingest kept out
    total: int  # files of the arrival so judged: the span's records and the copies of them kept out
    examples: list[str]  # the group's first URIs


class ShardEntry(Result):
    file: str = Field(pattern=r"^[^/\\\x00]*[^/\\\x00.][^/\\\x00]*$")  # a file name in the span folder, no path
    split: Literal["train", "eval"]
    records: int
    bytes: int
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # of the whole file as ingest wrote it: what a cached copy must match


class SourceEntry(Result):
    """A source file as published: its identity is (uri, size, version)."""

    uri: str
    size: int
    version: str


class SpanManifest(Result):
    """ROOT/data/spans/span-NNNNN/_MANIFEST.json, written last: the span exists once it does."""

    span: int
    created: str
    source: str
    compression: Literal["gzip", "zlib", "none"] = "gzip"
    counts: SpanCounts
    labels: list[str]
    shards: list[ShardEntry]
    sources: list[SourceEntry]
    settings: dict = {}  # the ingest settings, SOURCE and ROOT aside
    max_side: int | None = None  # longest side of any image in the span; None: as large as they came
    anomalies: list[Anomaly] = []
    quality: list[QualityFinding] = []  # reported image-quality issues; spans published before have none
    same_picture: SamePicture | None = None  # None: published before ingest judged it
    _sha256: str | None = PrivateAttr(None)  # of the bytes it was read from (Root.read_manifest), which a record names
    sha256 = property(lambda self: self._sha256)


# ---------------------------------------------------------------- a run: training


class LossAccuracy(Result):
    loss: float | None
    accuracy: float | None


class InputProbe(Result):
    """Was the accelerator waiting for input? Empty when the probe was skipped."""

    input_images_per_sec: float | None = None
    model_images_per_sec_synthetic: float | None = None
    real_step_seconds: float | None = None
    synthetic_step_seconds: float | None = None
    real_vs_synthetic: float | None = None
    input_wait_seconds: float | None = None
    input_bound: bool | None = None
    # What the cheapest fix depends on: the shards' codec, image_cache, a sample of the stored records (stored_images).
    compression: str | None = None
    cache: str | None = None
    stored_short_side: int | None = None
    jpeg_share: float | None = None
    decoded_gb: float | None = None  # the training split decoded, as image_cache would hold it
    memory_gb: float | None = None


class DataServiceUse(Result):
    """The tf.data service the training input ran on (components/train/data.py)."""
    address: str
    processing_mode: str
    workers: int  # registered (a lost worker stays on the list) when training started
    workers_at_end: int | None = None  # None: the dispatcher no longer answered


class ProfilerVerdict(Result):
    """The TensorFlow Profiler's input-pipeline analyzer on the traced steps (the Profile tab's summary)."""

    input_percent: float | None  # share of step time spent waiting for input
    classification: str  # the analyzer's word: highly, moderately, could, potentially, not (input-bound)
    input_bound: bool  # classification "highly": input time is at least 20% of the step
    step_time_ms: float | None
    input_time_ms: float | None
    steps: int
    conclusion: str  # the analyzer's sentence, as the Profile tab shows it
    trace: str  # the profile session folder


class CorruptShard(Result):
    uri: str
    error: str | None
    readable: int
    expected: int


class Corrupt(Result):
    skipped_records: int = 0
    shards: list[CorruptShard] = []


class TrainStart(Result):
    """Where a run started (components/train/warm.py): the served model's weights (warm) or afresh (full)."""

    kind: Literal["warm", "full"]
    reason: str  # in words: why warm, or why a full retrain
    from_version: int | None  # the served version a warm run restored
    new_spans: list[int]  # spans the served model had not learnt from (a full run: every span it read)
    replay_spans: list[int]  # spans a warm run replayed a sample of
    new_records: int
    replay_records: int
    warm_runs_since_full: int  # 0 for a full run; counts on with each warm run (train.full_every)


class BackupStart(Result):
    """ROOT/runs/<id>/backup/start.json: the start a run's backup grows from (components/train/warm.py),
    written before its first backup. A rerun of the run id resumes from the backup only from the same start."""

    kind: Literal["warm", "full"]
    from_version: int | None  # the served version a warm run restored
    lineage: str | None  # that version's lineage: the run that made it and when it was pushed


class Schedule(Result):
    kind: Literal["cosine", "constant"]
    peak_learning_rate: float
    warmup_steps: int
    decay_steps: int
    weight_decay: float
    label_smoothing: float
    ema_momentum: float | None


class TrainPhase(Result):
    """One phase of a run (components/train/recipe.py): `all` trains everything (from scratch, say); from a
    pretrained backbone, `head` trains the new head with the backbone frozen, then `fine_tune` all of it."""

    name: Literal["all", "head", "fine_tune"]
    epochs: int  # of this phase
    first_epoch: int  # counted from 1 over the run
    steps: int  # optimizer steps the phase makes
    peak_learning_rate: float
    warmup_steps: int
    trainable_parameters: int
    batch_norm: Literal["training", "inference"]  # inference: the backbone's moving statistics are kept as loaded
    resumed_from_step: int  # of this phase, restored from its backup (0: started afresh; `steps`: done before)


class BestEpoch(Result):
    epoch: int
    accuracy: float
    loss: float


# What changed between two environments is said with these names, in this order.
ENVIRONMENT_NAMES = {"python": "Python", "tensorflow": "TensorFlow", "tf_keras": "Keras (tf_keras)", "beam": "Beam",
                     "tfma": "TFMA", "numpy": "numpy", "pillow": "Pillow", "cuda": "CUDA", "cudnn": "cuDNN",
                     "gpu_driver": "GPU driver"}


class Environment(Result):
    """What a model was trained with (components/common/environment.py), which its lineage carries."""

    python: str
    tensorflow: str
    tf_keras: str | None
    beam: str | None
    tfma: str | None
    numpy: str | None
    pillow: str | None
    cuda: str | None  # as TensorFlow was built (tf.sysconfig.get_build_info); None: a build without CUDA
    cudnn: str | None
    gpu_driver: str | None  # None: no NVIDIA driver answered
    lock: str | None  # the lock every package of which is installed (requirements/test.lock...); None: none is
    lock_sha256: str | None  # of the lock file
    unlocked: list[str]  # installed beside the lock (or, without one, every package): name==version
    packages_sha256: str  # of the installed set, `name==version` lines, sorted

    def packages_in_words(self) -> str:
        return f"lock {self.lock_sha256[:6]}" if self.lock_sha256 else f"unlocked packages {self.packages_sha256[:6]}"

    def in_words(self) -> str:
        said = ", ".join(f"{name} {getattr(self, key)}" for key, name in ENVIRONMENT_NAMES.items()
                         if getattr(self, key) is not None)
        extra = f" (+{len(self.unlocked)} beside it)" if self.lock and self.unlocked else ""
        return f"{said}; {self.packages_in_words()}{f' ({self.lock})' if self.lock else ''}{extra}"

    def changes_since(self, before: Environment) -> list[str]:
        """What differs from `before`, one phrase each: "TensorFlow 2.21.0 -> 2.22.0", "lock a1b2c3 -> d4e5f6"."""
        changed = [f"{name} {getattr(before, key) or 'none'} -> {getattr(self, key) or 'none'}"
                   for key, name in ENVIRONMENT_NAMES.items() if getattr(before, key) != getattr(self, key)]
        if before.lock_sha256 and self.lock_sha256 and before.lock_sha256 != self.lock_sha256:
            changed.append(f"lock {before.lock_sha256[:6]} -> {self.lock_sha256[:6]}")
        elif before.lock_sha256 != self.lock_sha256 or (not self.lock_sha256 and before.packages_sha256 != self.packages_sha256):
            changed.append(f"{before.packages_in_words()} -> {self.packages_in_words()}")
        elif before.unlocked != self.unlocked:
            gone, new = sorted(set(before.unlocked) - set(self.unlocked)), sorted(set(self.unlocked) - set(before.unlocked))
            changed.append("beside the lock: " + ", ".join([f"+{p}" for p in new] + [f"-{p}" for p in gone]))
        return changed


class TrainMetrics(Result):
    """ROOT/runs/<id>/metrics.json, written last by training: the run's summary."""

    run_id: str
    run_dir: str
    model_dir: str
    network: str  # the network's identity: its name, module:function or <file>.py:function
    image_size: int
    labels: list[str]
    spans: list[int]
    # span -> SHA-256 of the manifest training read it by: which records the span held (None: a run from before)
    span_manifests: dict[int, str] | None = None
    strategy: str
    workers: int
    replicas: int
    precision: str
    xla: bool
    batch_size: int
    global_batch_size: int
    epochs: int
    steps_per_epoch: int
    total_steps: int
    resumed_from_step: int
    images_per_sec: float | None
    train: LossAccuracy
    eval: LossAccuracy
    history: dict[str, list[float]]
    input: InputProbe
    gpu: dict  # the GPU sampler's record (components/train/measure.py)
    corrupt: Corrupt
    exported_weights: Literal["ema", "final"] | None = None  # ema: the weights' moving average; final: the last step's
    schedule: Schedule | None = None
    seed: int | None = None
    best_epoch: BestEpoch | None = None  # by eval accuracy; the candidate is still the end of the run
    warnings: list[str] = []  # e.g. a run too short to converge, or one whose eval accuracy stayed at the majority's
    weights: str | None = None  # train.weights: none, imagenet or a path
    weights_file: str | None = None  # the file the network started from (None: from scratch)
    phases: list[TrainPhase] = []
    profiler: ProfilerVerdict | None = None  # None: no trace (trace_steps none) or no profile plugin
    data_service: DataServiceUse | None = None  # None: the input ran in the trainer
    staging: dict | None = None  # the shard cache's record (common/shard_cache.py); None: TensorFlow read ROOT
    dropped_label_errors: int | None = None  # train records left out as suspected label errors; None: not asked to
    start: TrainStart | None = None  # None: a run from before warm starts
    network_digest: str | None = None  # the SHA-256 of the network's code (None: a run from before it was recorded)
    environment: Environment | None = None  # None: a run from before environments were recorded
    untrained: list[str] = []  # classes of `labels` no record it trained on carries: it never answers them

    @property
    def label_set(self) -> LabelSet:
        return LabelSet(self.labels, self.untrained)


# ---------------------------------------------------------------- a run: the gate


class GateMetrics(Result):
    """TFMA's figures for one model on the eval split."""

    accuracy: float
    top_k_accuracy: float
    example_count: int
    top_k: int
    per_class_accuracy: dict[str, float]
    per_class_examples: dict[str, int]
    confusion_matrix: list[list[int]] | None = None  # [actual][predicted]
    majority_class_rate: float | None = None  # the candidate's only
    eval_label_counts: dict[str, int] | None = None  # the candidate's only


class Thresholds(Result):
    min_accuracy: float
    min_accuracy_inclusive: bool
    min_accuracy_source: str
    max_regression: float
    compared_to_baseline: bool
    top_k: int


class SharedClasses(Result):
    """The comparison with a served version that knows fewer classes, on the classes both know."""

    classes: list[str]
    example_count: int  # eval records of those classes
    accuracy: float  # the candidate's on those records
    baseline_accuracy: float
    per_class_accuracy: dict[str, float]
    baseline_per_class_accuracy: dict[str, float]


class PairedComparison(Result):
    """The candidate minus one served version on the same eval records (components/gate/evidence.py)."""

    version: int
    example_count: int  # records compared (those of the classes both know)
    accuracy: float  # the candidate's on those records
    baseline_accuracy: float  # the version's on those records
    difference: float  # candidate minus version
    interval: tuple[float, float]  # of the difference, at `confidence`
    p_value: float  # McNemar's exact test
    method: str
    discordant: tuple[int, int]  # records only the candidate gets right, records only the version gets right
    detectable_difference: float  # smallest difference these records detect with 80% power


class ClassComparison(Result):
    """One class's eval records, the candidate against the served version (components/gate/forgetting.py)."""

    label: str
    example_count: int  # eval records of the class
    right: int  # records of the class the candidate gets right
    baseline_right: int  # records of the class the served version gets right
    discordant: tuple[int, int]  # records only the candidate gets right, records only the served version
    p_value: float  # McNemar's exact test, one-sided: the candidate is worse
    threshold: float  # Holm's level for this p-value's rank among the classes
    verdict: Literal["worse", "within noise", "held"]  # held: no fall beyond max_regression


class PerClassComparison(Result):
    """The guard against forgetting: every class the served version knows, compared on its own records."""

    version: int  # the served version compared with
    method: str
    level: float  # family-wise: 1 - confidence, over all the classes together
    max_regression: float  # a class counts as worse only if it also falls by more than this
    classes: list[ClassComparison]  # the classes with eval records, in class-id order


class ReferenceComparison(PerClassComparison):
    """The guard against forgetting against the reference, the version whose recorded answers candidates are held
    to class by class (components/gate/reference.py), on the eval records both answered."""

    pushed_at: str  # when the reference was pushed
    days: int  # from its push to this gate
    versions_since: int  # versions pushed after it


class GateReference(Result):
    """The version whose recorded answers a candidate was held to class by class (components/gate/reference.py)."""

    version: int
    kept: bool  # once the candidate is pushed, later candidates are held to it too (a warm run); False: to the candidate


class Comparison(PairedComparison):
    """The paired comparison with the newest served version, and the rule that decided."""

    decision: Literal["evidence", "point"]
    confidence: float
    best_retained: PairedComparison | None = None  # against the retained version most accurate on these records
    per_class: PerClassComparison | None = None  # None: gate.per_class off, or gated before it existed
    # None: per_class off, no reference, or the reference is the newest served version (per_class is then against it)
    reference: ReferenceComparison | None = None


class Answers(Result):
    """ROOT/runs/<id>/answers.json.gz (JSON, gzipped), and assets.extra/stoke_answers.json.gz of the version the run
    became: the class the candidate answered for each eval record at its gate (components/gate/answers.py)."""

    labels: list[str]  # the model's classes, by id
    records: dict[str, tuple[int, int]]  # SHA-256 of the record's image/encoded -> (its label id then, the class answered)


class Collapse(Result):
    """A candidate that answers one class for most eval records (components/gate/decision.py collapse)."""

    label: str
    answered: int  # eval records it answered with the class
    actual: int  # eval records of the class
    example_count: int


class GateResult(Result):
    """ROOT/runs/<id>/gate.json: the blessing and its reasons (BLESSED/NOT_BLESSED beside it)."""

    run_id: str
    model_name: str
    blessed: bool
    reasons: list[str]
    notes: list[str]
    metrics: GateMetrics
    baseline: GateMetrics | None
    baseline_version: int | None  # the served version compared with, None when not compared
    shared_classes: SharedClasses | None = None  # set when compared on the classes both know
    comparison: Comparison | None = None  # paired, per record; None: no served version to compare with
    collapse: Collapse | None = None  # None: the candidate answers more than one class
    served_version: int | None  # the newest served version when gated
    reference: GateReference | None = None  # None: held to no reference, as when no served version recorded answers
    thresholds: Thresholds
    serving_check: dict  # components/gate/serving_check.py's report
    labels: list[str]
    spans: list[int]  # the spans whose eval records it was gated on: every span the data check lets in
    tfma_uri: str
    tfma_validation_ok: bool
    confusion_matrix_uri: str
    warmup_uri: str
    gate_uri: str
    gated_at: str

    def log_lines(self) -> list[tuple[int, str]]:
        verdict = f"{'BLESSED' if self.blessed else 'NOT BLESSED'}: accuracy {self.metrics.accuracy:.4f}"
        return [(logging.INFO if self.blessed else logging.WARNING, verdict),
                *((logging.INFO, f"  - {reason}") for reason in self.reasons + self.notes)]
