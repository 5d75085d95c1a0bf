"""The ROOT layout of docs/layout.md (The artifact ROOT): the one place that knows where each artifact lives.

ROOT is a local path, file://, s3:// or gs:// (config.py says why no other). Every stage reads and
writes under it, so stages hand each other URIs, never objects in memory. `Root` names the data
(labels, spans and their shards), the runs, the model repositories and the serving context; `RunDir`
names the files of one run. No other module spells these names, and nothing here reads them: what the spans under
a ROOT hold is read by components/common/spans.py.
"""
from __future__ import annotations

import dataclasses
import datetime
import posixpath
import re

from components.contracts.config import check_run_id, span_ranges
from components.contracts.paths import join
from components.contracts.schema import SPLITS

MANIFEST = "_MANIFEST.json"
DEAD_LETTER = "dead_letter.jsonl"
LABELS = "labels.json"
# Beside a span's shards: what its records hold. The content index is one line per record, sorted by
# SHA-256 (`sha256 TAB dhash TAB split TAB "label" TAB "uri"`, label and URI as JSON strings), so a
# new arrival's hashes merge against it in one streaming pass. Derived from the shards: its readers
# check it as they stream it (sorted, whole, as many lines as the manifest counts records), and one
# missing or damaged is rebuilt from them (components/common/trusted_index.py).
CONTENT_INDEX = "content_index.tsv.gz"
# What a span's sources are, by identity: `# sources N` then N lines sorted as strings,
# `"uri" TAB size TAB "version"` (URI and version as JSON strings, local paths by their real path),
# so a listing sorted alike merges against every span's index in one streaming pass. Derived from
# the manifest's `sources`: a span published without one gets it built from its manifest.
SOURCE_INDEX = "source_index.tsv.gz"
# A span's statistics as TFX's StatisticsGen lays them out, statistics/Split-<split>/FeatureStats.pb: each a
# binary tensorflow_metadata DatasetFeatureStatisticsList with one dataset, what TFDV's generator computes
# for the records' features (beam_jobs/statistics.py).
STATISTICS = "statistics"
STATISTICS_SPLIT = "Split-{split}"
FEATURE_STATS = "FeatureStats.pb"
# The data check's record of a published span (summaries.DataCheckRecord): training and the gate read a
# span only when its record is valid and says ok, warning or released. Fail closed: a span published by
# hand, or by a run that died before its check, is not read until the data check has judged it. A record
# is valid for the manifest it judged only (components/common/spans.py).
DATACHECK = "_DATACHECK.json"
LABEL_ERRORS = "label_errors.png"  # beside the record: the first suspected label errors, as the label check saw them
SPAN_PATTERN = re.compile(r"^span-(\d{5,})$")
METRICS = "metrics.json"  # in a run folder: written last by training, so its presence means finished
WARMUP_FILE = "tf_serving_warmup_requests"  # TF Serving's name, in a run and in assets.extra/ of a version
# In a run folder: a copy of the network code of the user's that the run trained with (its file, or its module's
# package). A run's config.json names a file network by its copy here, `code/<file>.py:<function>`, beside it.
CODE = "code"

# Shard file suffix for each codec the ingest job can write; readers take the codec from the manifest.
SHARD_SUFFIX = {"gzip": ".tfrecord.gz", "zlib": ".tfrecord.zz", "none": ".tfrecord"}
TF_COMPRESSION = {"gzip": "GZIP", "zlib": "ZLIB", "none": ""}


class Root:
    """Paths under one artifact ROOT."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/") or "/"

    @property
    def data(self) -> str:
        return join(self.uri, "data")

    @property
    def labels(self) -> str:
        return join(self.data, LABELS)

    @property
    def ingest_lock(self) -> str:
        """The lock file (local) or lease object (bucket) that one ingest at a time holds."""
        return join(self.data, ".ingest.lock")

    @property
    def spans(self) -> str:
        return join(self.data, "spans")

    def span(self, number: int) -> str:
        return join(self.spans, span_name(number))

    def manifest(self, number: int) -> str:
        return join(self.span(number), MANIFEST)

    def dead_letter(self, number: int) -> str:
        return join(self.span(number), DEAD_LETTER)

    def content_index(self, number: int) -> str:
        return join(self.span(number), CONTENT_INDEX)

    def source_index(self, number: int) -> str:
        return join(self.span(number), SOURCE_INDEX)

    def statistics(self, number: int, split: str) -> str:
        """Span `number`'s statistics of one split (train or eval)."""
        if split not in SPLITS:
            raise ValueError(f"no split {split!r}; splits: {', '.join(SPLITS)}")
        return join(self.span(number), STATISTICS, STATISTICS_SPLIT.format(split=split), FEATURE_STATS)

    def datacheck(self, number: int) -> str:
        return join(self.span(number), DATACHECK)

    def label_errors_sheet(self, number: int) -> str:
        return join(self.span(number), LABEL_ERRORS)

    @property
    def runs(self) -> str:
        return join(self.uri, "runs")

    def run(self, run_id: str) -> RunDir:
        """The folder of run `run_id`; refuses ids that could leave ROOT/runs."""
        return RunDir(join(self.runs, check_run_id(run_id)))

    @property
    def prune_lock(self) -> str:
        """The lease one prune of the run folders at a time holds (components/common/run_retention.py)."""
        return join(self.runs, ".prune.lock")

    @property
    def running_leases(self) -> str:
        """The leases of the flow runs of this ROOT, each held while its run runs (flows/lost_runs.py)."""
        return join(self.runs, ".running")

    def running(self, flow_run: str) -> str:
        """The lease of a flow run of this ROOT, by its Prefect id: one found free while Prefect still calls its
        run Running is a run that died without a word."""
        return join(self.running_leases, f"{flow_run}.lock")

    def models(self, name: str) -> str:
        return join(self.uri, "models", name)

    @property
    def serving(self) -> str:
        return join(self.uri, "serving")


class RunDir:
    """The files of one run, ROOT/runs/<run-id>/; every stage of the run writes here."""

    def __init__(self, uri: str):
        self.uri = uri
        self.run_id = posixpath.basename(uri.rstrip("/"))

    def __str__(self) -> str:
        return self.uri

    def _file(self, name: str) -> str:
        return join(self.uri, name)

    config = property(lambda self: self._file("config.json"))  # the run configuration, resolved, written first
    code = property(lambda self: self._file(CODE))  # the network code of the user's the run trained with
    arrived = property(lambda self: self._file("arrived.txt"))  # files notifications announced: all ingest reads
    # training: backup (resume), tensorboard, the candidate, metrics last
    backup = property(lambda self: self._file("backup"))
    backup_start = property(lambda self: join(self.backup, "start.json"))  # the start the backup grows from
    tensorboard = property(lambda self: self._file("tensorboard"))
    candidate = property(lambda self: self._file("candidate"))
    saved_model = property(lambda self: join(self.candidate, "saved_model.pb"))  # what makes the candidate load
    metrics = property(lambda self: self._file(METRICS))
    curves = property(lambda self: self._file("curves.png"))
    # the gate: TFMA output, the warm-up requests it replayed, its verdict; the marker last
    tfma = property(lambda self: self._file("tfma"))
    warmup = property(lambda self: join(self.uri, "warmup", WARMUP_FILE))
    gate = property(lambda self: self._file("gate.json"))
    answers = property(lambda self: self._file("answers.json.gz"))  # the candidate's per record; the push copies it
    confusion_matrix = property(lambda self: self._file("confusion_matrix.png"))
    blessed = property(lambda self: self._file("BLESSED"))
    not_blessed = property(lambda self: self._file("NOT_BLESSED"))
    # push, and the run's report
    push_intent = property(lambda self: self._file("push_intent.json"))  # written before the version, removed after
    pushed = property(lambda self: self._file("pushed.json"))
    report_md = property(lambda self: self._file("report.md"))
    report_json = property(lambda self: self._file("report.json"))
    gpus_plot = property(lambda self: self._file("gpus.png"))
    throughput_plot = property(lambda self: self._file("throughput.png"))
    comparison_plot = property(lambda self: self._file("comparison.png"))  # the paired difference, by the report
    labels_plot = property(lambda self: self._file("labels.png"))  # the new span's label mix against the history's
    label_errors_plot = property(lambda self: self._file(LABEL_ERRORS))  # a copy of the newest span's sheet
    root = property(lambda self: posixpath.dirname(posixpath.dirname(self.uri.rstrip("/"))))  # ROOT of ROOT/runs/ID
    # The retention rule (components/common/run_retention.py): what it did to ROOT/runs as this run ended, and
    # its marker in a folder it prunes, written before it removes anything.
    retention = property(lambda self: self._file("retention.json"))
    pruned = property(lambda self: self._file("pruned.json"))

    @property
    def heavy(self) -> list[str]:
        """The heavy parts of the run, which the retention rule removes first; the rest is the run's record
        (metrics.json, the train stage's result, among it)."""
        return [self.candidate, self.backup, self.tensorboard, self.tfma, posixpath.dirname(self.warmup), self.answers]

    def result(self, stage: str) -> str:
        """The one file of a stage's result in the run: `<stage>.json`; train's is metrics.json, the name it
        had before every stage had one."""
        return self.metrics if stage == "train" else self._file(f"{stage}.json")

    def phase_backup(self, phase: str) -> str:
        """The backup of one phase of a run fine-tuned from pretrained weights (backup/head, backup/fine_tune);
        a run in one phase backs up into `backup` itself."""
        return join(self.backup, phase)


@dataclasses.dataclass(frozen=True)
class Shard:
    uri: str
    compression: str  # TFRecordDataset compression_type: "GZIP", "ZLIB" or ""
    records: int
    span: int
    bytes: int | None = None  # as the manifest records it
    sha256: str | None = None  # as the manifest records it: a cached copy is used only when it matches
    manifest_sha256: str | None = None  # of the span's manifest that named the shard: which records the span holds


def parse_spans(text: str | None) -> list[int] | None:
    """`"3"`, `"1,4"`, `"2-5"` or `"1-3,7"` to span numbers; None or "" or "all" means every span. A list that
    names too many spans or numbers out of bounds is a ValueError before any is counted (config.span_ranges)."""
    ranges = span_ranges(text)
    if ranges is None:
        return None
    return sorted({number for low, high in ranges for number in range(low, high + 1)})


def new_run_id(started: datetime.datetime | None = None, name: str | None = None) -> str:
    """`run-20261201-021500[-name]`: the start in UTC, sortable, plus what started it (a flow run's
    name) so two runs started in the same second stay apart."""
    started = (started or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
    return check_run_id(f"run-{started:%Y%m%d-%H%M%S}" + (f"-{name}" if name else ""))


def span_name(number: int) -> str:
    return f"span-{number:05d}"


def shard_name(split: str, index: int, count: int, compression: str = "gzip") -> str:
    return f"{split}-{index:05d}-of-{count:05d}{SHARD_SUFFIX[compression]}"
