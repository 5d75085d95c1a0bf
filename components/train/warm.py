"""Where a run starts: from the served model's weights (warm), or afresh (full), and what a warm run reads.

A nightly run costs what its new data costs. When the served model (the newest version in
ROOT/models/<model_name>) has the network, image size and label set this run would train, the run
restores its weights and trains on the checked spans it has not learnt from plus a replay sample of
those it has, stratified by class: experience replay, which keeps what a network learnt when new data
alone would make it forget (Rolnick et al. 2019, "Experience Replay for Continual Learning"; Chaudhry
et al. 2019, "On Tiny Episodic Memories in Continual Learning", where even a small memory of past
examples replayed beside the new ones holds most of the old accuracy).

A full retrain instead when:
- train.warm_start is off, or nothing is served, or the served version has no lineage to compare with;
- the network, the image size or the label set changed (the served weights do not fit, or a new class
  needs its logits learnt from all the data); a network is its identity and the SHA-256 of its code
  (components/common/networks.py), so an edit of the network's code is a full retrain too;
- no checked span is new to the served model (a rerun on the same data is asked for a reason); a span is
  new unless the served version's lineage names its number with its manifest's SHA-256;
- the inputs changed, on evidence: a new span a person released after its data check quarantined it
  (they accepted what the check called an error: a vanished class, a new kind of image), or a new span
  whose images' sizes are unlike the history's (the camera changed). Label drift alone does not count:
  the data check warns on every skewed night, and a skewed night is what the replay sample is for;
- train.full_every runs in a row would otherwise be warm: warm-started networks generalise worse than
  ones trained afresh on the same data, and the gap grows with each warm start (Ash & Adams 2020, "On
  Warm-Starting Neural Network Training"), so a periodic full retrain resets it.

The replay sample is read from the history's shards without decoding an image (one pass over their
records' label and source features: the bytes of the history, not its decoding, which is what costs),
and chosen by a hash of (seed, newest new span, source) within each class: the same on a rerun or a
resume, another sample the next night.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import os
import shutil
import tempfile

import tensorflow as tf

from components.common import networks
from components.common.repository import Repository, RepositoryError
from components.common.spans import Spans
from components.common.tf_files import pull, tf_reads
from components.contracts import schema
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root, Shard
from components.contracts.lineage import Lineage
from components.contracts.results import BackupStart, ResultError
from components.contracts.run_config import RunConfig
from components.contracts.summaries import rollback_command
from components.train import TrainError

# Each class of the history keeps at least this many records in the replay sample (or all it has): a
# rare class, or one that no longer arrives, is never left out of what the network sees again.
MIN_REPLAY_PER_CLASS = 16


@dataclasses.dataclass(frozen=True)
class Start:
    """How the run starts; with `warm`, from which served version and on which spans."""
    kind: str  # "warm" | "full"
    reason: str  # in words, for metrics.json and the report
    from_version: int | None = None
    version_uri: str | None = None  # the served version whose weights the network restores
    rollback: str | None = None  # the command that takes that version out of serving
    lineage: str | None = None  # that version's lineage: the run that made it and when it was pushed
    new_spans: tuple[int, ...] = ()
    replay_spans: tuple[int, ...] = ()
    warm_runs_since_full: int = 0

    @property
    def warm(self) -> bool:
        return self.kind == "warm"


def full(reason: str) -> Start:
    return Start(kind="full", reason=reason)


def decide(config: RunConfig, labels: LabelSet, spans: dict[int, str]) -> Start:
    """Warm or full for a run over the checked `spans` (each with its manifest's SHA-256; their labels
    `labels`), and why. A span is learnt when the served version's lineage names its number and its manifest:
    a number published again (its span deleted by hand) holds records the served model never saw."""
    settings = config.train
    if not settings.warm_start:
        return full("train.warm_start is off")
    try:
        repository = Repository(config.root, config.model_name)
        version = repository.newest()
        lineage = repository.lineage(version) if version is not None else None
    except (RepositoryError, ResultError, OSError) as exc:
        return full(f"the served model could not be read ({str(exc).splitlines()[0]})")
    if version is None:
        return full(f"no version of {config.model_name} is served")
    if lineage is None:
        return full(f"served version {version} has no lineage to compare with")
    changed = _changed(lineage, networks.load(settings.network), settings.image_size, labels)
    if changed:
        return full(f"{changed} since served version {version}")
    learnt = lineage.trained_on()
    new = tuple(n for n, digest in sorted(spans.items()) if (n, digest) not in learnt)
    if not new:
        return full(f"no checked span is new to served version {version}")
    drift = _inputs_changed(Root(config.root), new)
    if drift:
        return full(drift)
    previous = lineage.training.start
    since = previous.warm_runs_since_full if previous is not None and previous.kind == "warm" else 0
    if since >= settings.full_every:
        return full(f"{since} warm runs in a row since the last full retrain (train.full_every {settings.full_every})")
    return Start(kind="warm", reason=f"served version {version} has the same network, image size and labels",
                 from_version=version, version_uri=repository.version_uri(version),
                 rollback=rollback_command(config.root, config.model_name),
                 lineage=f"run {lineage.run_id}, pushed {lineage.pushed_at}",
                 new_spans=new, replay_spans=tuple(n for n in sorted(spans) if n not in new), warm_runs_since_full=since + 1)


def _changed(lineage: Lineage, network: networks.Code, image_size: int, labels: LabelSet) -> str | None:
    """What differs between the served model and this run, in words; None when nothing does. A class the run
    keeps an id for without a record (a held span's) is no new class: neither model answers it."""
    served = lineage.training
    if served.network != network.identity:
        return f"train.network changed from {served.network} to {network.identity}"
    if served.network_digest != network.digest:
        return (f"network code changed (SHA-256 {served.network_digest[:12]} to {network.digest[:12]})"
                if served.network_digest else "network code unrecorded (no SHA-256 of it in the lineage)")
    if lineage.training.image_size != image_size:
        return f"train.image_size changed from {lineage.training.image_size} to {image_size}"
    served = lineage.label_set
    if served != labels:
        added = [name for name in labels.answered if name not in served.answered]
        kept = labels.labels[:len(served.labels)] == served.labels and set(served.answered) <= set(labels.answered)
        return f"new class{'es' if len(added) > 1 else ''} {', '.join(added)}" if added and kept else \
            "the label set changed"
    return None


def _inputs_changed(root: Root, new: tuple[int, ...]) -> str | None:
    """Evidence in the new spans' data-check records that the inputs changed, in words; None without."""
    for number in new:
        record = Spans(root).check_record(number).record
        if record is None:
            continue
        if record.status == "released":
            return f"span {number} was released by hand after its data check held it back (the inputs changed)"
        if any(a.kind == "image_size" for a in record.anomalies):
            return f"span {number}'s images are sized unlike the history's (the data check's image_size anomaly)"
    return None


def restore(model, start: Start) -> None:
    """The served version's weights into `model`, a network build_model made of the same kind: the SavedModel
    tracks its network as `model` (models.ServingModule), so its checkpoint restores every weight by the
    object graph. A ROOT TensorFlow cannot read (s3://) is copied to a local folder first. A version that
    cannot be restored (cut short, overwritten, a file missing) is a TrainError with the ways out."""
    local = None
    try:
        folder = f"{start.version_uri}/variables"
        if not tf_reads(start.version_uri):
            local = tempfile.mkdtemp(prefix="stoke-served-")
            pull(folder, local)
            folder = local
        status = tf.train.Checkpoint(model=model).read(os.path.join(folder, "variables") if local else
                                                      f"{folder}/variables")
        status.expect_partial()  # the module's label table and signatures are not the network's
        status.assert_existing_objects_matched()
    except Exception as exc:  # the reader raises what the damage makes of it: IndexError, DataLossError, ValueError...
        why = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise TrainError(f"served version {start.from_version} ({start.version_uri}) could not be restored for a warm "
                         f"start ({why}); set train.warm_start=false for a full retrain, or take it out of serving "
                         f"(`{start.rollback}`)") from None
    finally:
        if local:
            shutil.rmtree(local, ignore_errors=True)


# ---------------------------------------------------------------- a backup's start
# A run killed mid-training resumes from its backup, which grew from the weights the run started with. A
# rerun may start otherwise (the version it restored rolled back since, train.warm_start changed): the
# backup then holds weights of another start than the one the rerun would record in metrics.json and the
# lineage, so it is resumed only from the start it records.

def backup_start(start: Start) -> BackupStart:
    """What a backup records of the start it grows from: afresh, or warm from which push of which version."""
    return BackupStart(kind=start.kind, from_version=start.from_version, lineage=start.lineage)


def resumable(made: BackupStart | None, start: Start) -> str | None:
    """Why a backup made under `made` (None: it records no start) is no backup for a run that starts as
    `start`, in words; None when the run may resume from it."""
    now = backup_start(start)
    if made == now:
        return None
    was = ("it records no start (made before backups did)" if made is None else
           "it was made by a full retrain" if made.kind == "full" else f"it grew from {_version(made)}")
    return f"{was}, and this run {'is a full retrain' if now.kind == 'full' else 'starts from ' + _version(now)}"


def _version(start: BackupStart) -> str:
    return f"served version {start.from_version} ({start.lineage})"


# ---------------------------------------------------------------- the replay sample

@dataclasses.dataclass(frozen=True)
class Replay:
    records: int  # history records the run replays
    left_out: tuple[tuple[int, str], ...]  # (span, image/source) of the history records it does not
    per_class: dict[int, int]  # label id -> records replayed


def replay_sample(history: list[tuple[int, int, str]], new_records: int, share: float, key: str) -> Replay:
    """About `share` x `new_records` of the (label, span, source) records of `history`, stratified by class:
    each class its share of the history, at least MIN_REPLAY_PER_CLASS (or all it has). `key` orders each
    class, by source (then span: a file rewritten in place is in two spans of the history under one source)."""
    by_class: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    for label, span, source in history:
        by_class[label].append((span, source))
    wanted = share * new_records
    kept, left_out, per_class = 0, [], {}
    for label, records in sorted(by_class.items()):
        quota = min(len(records), max(MIN_REPLAY_PER_CLASS, math.ceil(wanted * len(records) / len(history))))
        ranked = sorted(records, key=lambda r: (hashlib.sha256(f"{key}\0{r[1]}".encode()).digest(), r[0]))
        per_class[label] = quota
        kept += quota
        left_out += ranked[quota:]
    return Replay(records=kept, left_out=tuple(left_out), per_class=per_class)


def labelled_sources(shards: list[Shard], skip_corrupt: bool) -> list[tuple[int, int, str]]:
    """(label, span, image/source) of every record of `shards`, read without decoding an image."""
    spec = {key: schema.feature_spec()[key] for key in (schema.LABEL, schema.SOURCE)}
    found = []
    for shard in shards:
        records = tf.data.TFRecordDataset(shard.uri, compression_type=shard.compression)
        if skip_corrupt:
            records = records.ignore_errors()
        for batch in records.batch(1024).map(lambda b: tf.io.parse_example(b, spec)):
            found += ((int(label), shard.span, source.decode()) for label, source in
                      zip(batch[schema.LABEL].numpy().reshape(-1), batch[schema.SOURCE].numpy().reshape(-1)))
    return found
