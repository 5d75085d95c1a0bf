"""What stage programs print and the flow keeps: each program's summary (ingest, preflight, push; the
trainer's is metrics.json and the gate's gate.json, in results.py), the run report, and the
progress events programs print while they work. Strict both ways, like every result.
"""
from __future__ import annotations

import json
import logging
import posixpath
import shlex
from typing import Literal

from pydantic import ConfigDict, Field

from components.contracts.label_check import LabelCheck, SuspectedLabel
from components.contracts.results import (
    Anomaly,
    Comparison,
    DataServiceUse,
    Environment,
    GateMetrics,
    LossAccuracy,
    ProfilerVerdict,
    QualityFinding,
    Result,
    SpanCounts,
    Thresholds,
    TrainPhase,
    TrainStart,
)


class Summary(Result):
    """A stage program's summary: the JSON object on the last line of its stdout with --json, and its
    result in the run folder (RunDir.result). Keys of one outcome only (a published span's counts, a
    failure's error) have defaults; a summary holds the keys its stage set, and no others."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), validate_assignment=True)

    def to_json(self) -> dict:
        return self.model_dump(mode="json", exclude_unset=True)


class DeadLetter(Result):
    """A source set aside, and why: a line of the span's dead_letter.jsonl."""

    uri: str
    reason: str
    size: int
    version: str


class NearPair(Result):
    """A new picture within a few bits of dHash of another (a re-encoded, resized, cropped or mirrored
    copy): `split` is where the new one went, `other_split` where the other is."""

    uri: str
    split: str
    other_uri: str
    other_split: str
    other_span: int | None = None  # None: this span
    distance: int
    mirrored: bool = False  # found through the mirror image's dHash


class NearDuplicates(Result):
    """New records that are near-copies of a published image or of another new one (beam_jobs/near_copies.py)."""

    count: int  # near-copies found
    examples: list[NearPair]  # the first 5
    moved: int = 0  # of them, records that joined their original's split instead of their own
    set_aside: int = 0  # of them, records set aside (ingest.near_copies set_aside)
    across: int = 0  # of them, records left in the other split: a manifest gave both splits, or report
    crowded: int = 0  # new records in crowds of pictures alike at 9x8 (near_lookup.CROWD): judged by block colours
    warning: str | None = None  # following them moved the eval share far from ingest.eval_fraction


class IngestSummary(Summary):
    """Ingest: a published span; nothing new (`message`); or nothing published (`error`)."""

    published: bool
    span: int | None = None  # None: nothing new
    new_sources: int | None = None
    removed_debris: list[str] | None = None  # staging folders and half-written spans of killed jobs
    message: str | None = None
    error: str | None = None
    span_uri: str | None = None
    counts: SpanCounts | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    shards: int | None = None
    seconds: float | None = None
    images_per_sec: float | None = None
    dead_letters: list[DeadLetter] | None = None  # the first 20
    dead_letter_uri: str | None = None
    unchanged: int | None = None  # files with a new version (mtime, ETag) but published content: not new
    duplicates: int | None = None  # exact copies kept out (also in dead_letters, not counted as bad)
    set_aside: dict[str, int] | None = None  # images set aside for their quality (blank frames...), by folder
    anomalies: list[Anomaly] | None = None
    near_duplicates: NearDuplicates | None = None
    quality: list[QualityFinding] | None = None  # image-quality issues of records kept (reported)

    def log_lines(self) -> list[tuple[int, str]]:
        """The span in figures; what was not new, kept out or set aside; near-copies, and an eval share they moved."""
        if not self.published:
            return [(logging.INFO, self.message or "nothing published")]
        counts, near = self.counts, self.near_duplicates or NearDuplicates(count=0, examples=[])
        said = [f"{posixpath.basename(self.span_uri)}: {counts.train:,} train + {counts.eval:,} eval records in "
                f"{self.shards} shards; {self.new_sources:,} new files in {self.seconds:,.1f} s "
                f"({self.images_per_sec or 0:,.0f} images/s)"]
        if self.unchanged:
            said.append(f"{self.unchanged} files with a new version but published content were not new (recognised by "
                        "content)")
        if counts.duplicates:
            said.append(f"{counts.duplicates} copies (and near-copies set aside) of images already published or listed "
                        "were kept out")
        if near.count:
            said.append(f"{near.count} new images are near-copies of another (re-encoded, resized, cropped or mirrored): "
                        f"{near.moved} joined their original's split, {near.set_aside} set aside, {near.across} left in "
                        "the other split")
            said += [f"  {p.uri} ({p.split}) ~ {p.other_uri} ({p.other_split})" for p in near.examples]
        if near.crowded:
            said.append(f"{near.crowded} new images lie among pictures alike at dHash's 9x8 (a fixed camera, scans, "
                        "products on white): judged by their block colours, the distinct ones kept their own split")
        for finding in self.quality or []:
            where = ", ".join(f"{count} in {folder}" for folder, count in finding.folders.items())
            said.append(f"{finding.count} {finding.kind.replace('_', ' ')} images kept ({where}), e.g. "
                        f"{finding.examples[0]}")
        if counts.dead_letter:
            said.append(f"{counts.dead_letter} set aside, reasons in {self.dead_letter_uri}:")
            said += [f"  {d.uri}: {d.reason}" for d in self.dead_letters or []]
        return [(logging.INFO, line) for line in said] + ([(logging.WARNING, near.warning)] if near.warning else [])


class Check(Result):
    """One preflight finding, with the flag or command that fixes it."""

    name: str
    status: Literal["ok", "warn", "fail", "skip"]
    summary: str
    fix: str | None
    facts: dict


class PreflightSummary(Summary):
    """Preflight (`stoke preflight`): the worst status of the checks, the failed ones by name, and all."""

    status: Literal["ok", "warn", "fail", "skip"]
    failed: list[str]
    checks: list[Check]

    def in_words(self) -> str:
        return f"Status: {self.status}" + (f"; failed: {', '.join(self.failed)}" if self.failed else "")

    def log_lines(self) -> list[tuple[int, str]]:
        """Every check but the first that failed: that one stops the run, whose failure is its line."""
        first = next((check for check in self.checks if check.status == "fail"), None)
        return [(logging.WARNING if c.status in ("warn", "fail") else logging.INFO,
                 f"{c.name} ({c.status}): {c.summary}" + (f" (fix: {c.fix})" if c.fix else ""))
                for c in self.checks if c is not first]


class HeadlineMetrics(Result):
    """The gate's figures that push's summary and the run report repeat (and `stoke run --json`)."""

    accuracy: float
    top_k_accuracy: float
    example_count: int
    majority_class_rate: float | None = None  # the report's only


class NoMetrics(Result):
    """`{}`: the run was not validated."""


class ServingCommands(Result):
    image: str
    docker_build: str
    docker_build_gpu: str
    docker_run: str
    docker_run_gpu: str
    predict: str


class ImageBuild(Result):
    built: bool
    reason: str | None = None  # why not


class ServingLabels(Result):
    """TF Serving's version labels in models.config."""

    stable: int
    canary: int


class SetAside(Result):
    """A child of the model repository that TF Serving would take for a version and Stoke does not,
    renamed out of TF Serving's sight (components/common/model_folders.py)."""

    name: str
    moved_to: str
    reason: str


class PushSummary(Summary):
    """Push: a new version (`pushed`); a run pushed before (`already_pushed`, `message`); or a refusal (`error`)."""

    pushed: bool
    already_pushed: bool | None = None
    run_id: str | None = None
    model_name: str | None = None
    version: int | None = None
    model_uri: str | None = None
    model_card: str | None = None  # the version's assets.extra/model_card.md
    serving_uri: str | None = None
    commands: ServingCommands | None = None
    image: ImageBuild | None = None
    message: str | None = None
    error: str | None = None
    previous_version: int | None = None
    versions: list[int] | None = None
    retired: list[int] | None = None
    cleaned_partial: list[str] | None = None
    set_aside: list[SetAside] | None = None
    serving_image: str | None = None
    trained_tensorflow: str | None = None
    labels: ServingLabels | None = None
    metrics: HeadlineMetrics | None = None

    def log_lines(self) -> list[tuple[int, str]]:
        if not self.pushed:
            return [(logging.INFO, self.message or "nothing pushed")]
        said = [f"pushed {self.run_id} as version {self.version} of {self.model_name}: {self.model_uri}",
                f"  build: {self.commands.docker_build}", f"  run:   {self.commands.docker_run}"]
        said += [f"  set aside {a.name!r} as {a.moved_to}: {a.reason}" for a in self.set_aside or []]
        return [(logging.INFO, line) for line in said]


# ---------------------------------------------------------------- the data check


class DataAnomaly(Result):
    """One finding of the data check, as data: the issue (`kind`), how bad, and either the file it is about
    (`file`, with the facts of its issue) or, for a finding about the span as a whole, how many records and a few."""

    kind: Literal["label_conflict", "label_drift", "new_label", "absent_class", "vanished_class", "same_image_flood",
                  "image_size", "rare_class", "no_statistics", "span_changed", "image_quality", "label_error"]
    severity: Literal["error", "warning"]
    message: str
    count: int | None = None  # records concerned (None: a property of the whole span)
    examples: list[str] = []  # a few URIs, where records can be named
    issue: str | None = None  # image_quality: which (blurry, dark, light, low_information, ...)
    folders: dict[str, int] = {}  # image_quality: the folders most of them came from, with their records
    file: str | None = None  # the one record (its source URI) this finding is about; None: the span
    label: SuspectedLabel | None = None  # label_error about one file: what it was given, what the model says
    class_name: str | None = None  # new_label, absent_class, vanished_class: the class it is about


# Which data check judged a span, in its record: raise it when the checks change, so records made by
# an earlier check can be told from today's.
DATACHECK_VERSION = 3


class DataCheckRecord(Result):
    """ROOT/data/spans/span-N/_DATACHECK.json: the data check's verdict on the span, and the only thing
    that lets training and the gate read it (ok, warning or released; quarantined holds it back, and a
    span without a valid record is not read at all). Rewritten whole, never removed: a release keeps
    the reasons and anomalies it let in, beside who and when. Valid for the manifest it names, with the
    status its anomalies give (`verdict`; components/common/spans.py says which record lets a span in)."""

    span: int
    check_version: int
    status: Literal["ok", "warning", "quarantined", "released"]
    checked_at: str
    reasons: list[str]  # the errors' messages, first first (what quarantined it)
    anomalies: list[DataAnomaly]
    released_by: str | None = None
    released_at: str | None = None
    label_check: LabelCheck | None = None  # None: a record made before the label check
    manifest_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # of the manifest judged; None: made before

    def suspected_label_errors(self) -> list[DataAnomaly]:
        """The files the label check flagged (what train.drop_suspected_label_errors leaves out)."""
        return [a for a in self.anomalies if a.kind == "label_error" and a.file is not None]


TRUSTED = ("ok", "warning", "released")  # the statuses training and the gate read


def verdict(anomalies: list[DataAnomaly]) -> str:
    """The status anomalies give a span: an error about it as a whole quarantines it (one about a file is for
    a person to look at), any other finding warns."""
    errors = any(a.severity == "error" and a.file is None for a in anomalies)
    return "quarantined" if errors else "warning" if anomalies else "ok"


class SpanCheck(Result):
    """The data check of one span: its anomalies against the history, and the status it recorded."""

    span: int
    status: Literal["ok", "warning", "quarantined", "released"]
    anomalies: list[DataAnomaly]
    history_spans: list[int]  # the spans compared with (the others the data check let in, with statistics)
    label_counts: dict[str, int]  # the span's records per class (train and eval)
    history_label_counts: dict[str, int] | None = None
    label_drift: float | None = None  # L-infinity distance of the class shares; None without history
    record_uri: str
    label_check: LabelCheck | None = None


def release_command(span: int, root: str | None) -> str:
    """The command that lets a held span in, runnable as printed: ROOT shell-quoted (a folder with a space
    in it), or the word ROOT where the root is not known (a record, whose folder may move)."""
    return f"stoke spans release {span} --root {shlex.quote(root) if root else 'ROOT'}"


def rollback_command(root: str, model_name: str) -> str:
    """The command that takes the newest version of `model_name` out of serving, runnable as printed."""
    return shlex.join(["stoke", "rollback", "--root", root, "--model-name", model_name])


class DataCheckSummary(Summary):
    """The data check: each span it checked (every span without a valid record, or the one asked for);
    or why nothing was checked."""

    spans: list[SpanCheck] = []
    message: str | None = None
    error: str | None = None
    root: str | None = None  # where the spans are: the hints to release a held one name it

    def held(self) -> list[SpanCheck]:
        return [check for check in self.spans if check.status == "quarantined"]

    def log_lines(self) -> list[tuple[int, str]]:
        """Each span's status, its findings (the first ten about single files), and how to let a held one in."""
        if not self.spans:
            return [(logging.INFO, self.message or self.error or "nothing checked")]
        lines = []
        for check in self.spans:
            files = [a for a in check.anomalies if a.file]
            lines += [(logging.INFO, f"span {check.span}: {check.status}")]
            # A record says ROOT, as the folder may move; the lines say where it is now, so a hint runs as printed.
            lines += [(logging.WARNING, f"  {a.severity}: {self._here(a.message)}") for a in check.anomalies if not a.file]
            lines += [(logging.INFO, f"    {a.file}: {a.message}") for a in files[:10]]
            lines += [(logging.INFO, f"    ... and {len(files) - 10} more in {check.record_uri}")] if len(files) > 10 else []
            if check.label_check is not None and check.label_check.status == "skipped":
                lines.append((logging.INFO, f"  label check skipped: {check.label_check.reason}"))
            if check.status == "quarantined":
                lines.append((logging.WARNING, f"  held back from training; after a look: "
                                               f"{release_command(check.span, self.root)}"))
        return lines

    def _here(self, line: str) -> str:
        """A finding's message, its release hint naming where the spans are now."""
        return line.replace("--root ROOT", f"--root {shlex.quote(self.root)}") if self.root else line


class SpanStatus(Result):
    """A row of `stoke spans`."""

    span: int
    status: Literal["ok", "warning", "quarantined", "released", "unchecked", "changed"]  # the last two: not read
    train: int
    eval: int
    dead_letter: int
    reason: str | None = None  # the first reason of the quarantine, or why the record is not valid
    released_by: str | None = None
    label_errors: int | None = None  # files the label check flagged; None: it did not run


class SpansSummary(Summary):
    """`stoke spans`: every published span and its status; or the span just released."""

    spans: list[SpanStatus] | None = None
    released: SpanStatus | None = None
    error: str | None = None


# ---------------------------------------------------------------- the run report


class TrainSection(Result):
    network: str
    spans: list[int]
    epochs: int
    total_steps: int
    strategy: str
    precision: str
    xla: bool
    replicas: int
    global_batch_size: int
    images_per_sec: float | None
    train: LossAccuracy
    eval: LossAccuracy
    model_dir: str
    resumed_from_step: int
    input_bound: bool | None
    input_images_per_sec: float | None
    model_images_per_sec: float | None
    input_wait_seconds: float | None
    verdict: str  # was the accelerator waiting for input, and the cheapest fix if so
    profiler: ProfilerVerdict | None = None  # None: no trace
    data_service: DataServiceUse | None = None  # None: the input ran in the trainer
    shards: str | None = None  # how the shards reached training when ROOT is in a bucket (the shard cache)
    weights: str | None = None  # train.weights
    phases: list[TrainPhase] = []
    start: TrainStart | None = None  # warm or full (None: a run from before warm starts)
    network_digest: str | None = None  # the SHA-256 of the network's code (None: a run from before it was recorded)
    environment: Environment | None = None  # None: a run from before Stoke recorded it


class GateSection(Result):
    blessed: bool
    reasons: list[str]
    notes: list[str]
    metrics: GateMetrics
    labels: list[str]
    thresholds: Thresholds
    baseline_version: int | None
    gate_uri: str
    comparison: Comparison | None = None  # None: no served version to compare with


class StageSection(Result):
    """A stage's section of the report when it has none of its own: its result in one line, and its warnings."""

    summary: str
    warnings: list[str]


class RunReport(Summary):
    """ROOT/runs/<id>/report.json: what one run did, one section per stage that left a summary.

    The headline has the keys of `stoke run --json`: status, message, blessed, pushed_version,
    reasons, metrics."""

    run_id: str
    run_dir: str
    stages: list[str]
    status: Literal["pushed", "refused", "skipped", "failed", "trained"]
    message: str
    alerts: list[str] = []  # what to know before reading on: a collapsed model, training's warnings
    blessed: bool
    pushed_version: int | None
    reasons: list[str]
    metrics: HeadlineMetrics | NoMetrics
    model_uri: str | None
    ingest: IngestSummary | None = None  # the summary's keys a report shows, those not null
    train: TrainSection | None = None
    gate: GateSection | None = None
    push: PushSummary | None = None  # the summary's keys a report shows, null when the push has none
    datacheck: DataCheckSummary | None = None
    sections: dict[str, StageSection] = {}  # the stages without a section of their own (preflight...), by name
    unserved_spans: list[str] = []  # published spans the served model was not trained on, with their status
    run_folders: str | None = None  # what the retention rule did to ROOT/runs as the run ended (retention.py)
    plots: dict[str, str]  # curves, gpus, confusion_matrix, throughput: PNG URIs
    config: dict | None = None  # the run configuration as config.json records it; None: not recorded
    config_json: str | None = None
    report_md: str
    report_json: str


# ---------------------------------------------------------------- progress


class Progress(Result):
    """A step of a stage program at work, printed with --json as one JSON line of stdout before its
    summary: `{"event": "progress", "stage": "ingest", "done": 12.0, "total": 40.0, "unit": "MB", ...}`.
    The "event" key tells it from a summary, which never has one."""

    event: Literal["progress"] = "progress"
    stage: str
    done: float
    total: float
    unit: str  # "MB" (ingest: of the new sources, converted), "epochs" (train: finished)
    seconds: float  # since the stage began

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total > 0 else None

    def describe(self) -> str:
        return f"{self.stage}: {self.done:,.0f} of {self.total:,.0f} {self.unit} after {self.seconds:,.0f} s"


def event(line: str) -> Progress | None:
    """The event a line of a program's stdout holds; None for any other line (a summary, text).
    Raises ResultError for a line with an "event" key that is no valid event: it is no summary either."""
    if not line.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or "event" not in data:
        return None
    return Progress.check(data, f"event line {line.strip()[:200]!r}")
