"""`python -m components.gate --root ROOT --run-id ID`: the gate between training and serving.

TensorFlow Model Analysis evaluates the candidate on the eval split of every span the data check lets in
(evalset.py), through its tf.Example signature: accuracy, top-k accuracy, accuracy per class (a slice per label)
and the confusion matrix. The newest version in ROOT/models/<name>/ is evaluated on the same
records as the baseline. A floor on accuracy (default: beat the share of the most common class, so a
model that learned nothing is never blessed) is given to TFMA. The comparison with the served
version is paired: both models answer the same records, one by one (correctness.py), and under
`gate.decision: evidence` (rule.py, evidence.py) a candidate is refused only when the whole interval of
the difference lies below -max_regression, against the newest served version or the retained version
most accurate on these records; `gate.decision: point` compares the two accuracies as they are (TFMA then
holds the same change threshold). When the candidate knows classes the served version does not
(labels are append-only, so they come last), the two are compared on the classes both know. Class by
class, a fall below the served version with evidence refuses (forgetting.py), under either decision,
and so does a fall below the reference (reference.py), judged on the answers its gate recorded.
A candidate that lacks a class the served version answers, or holds them in another order, is
refused whatever its accuracy (labelset.py: its own labels against the served version's lineage).
A fresh process then checks the serving contract with the warm-up requests the push will ship.

Writes ROOT/runs/ID/: tfma/, answers.json.gz (the candidate's answer to each eval record, which the
push keeps beside the version: answers.py), gate.json, confusion_matrix.png, warmup/, and BLESSED or
NOT_BLESSED last. Exit 0 either way: a refused model is a normal outcome.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import posixpath
import subprocess
import sys
import tempfile

from components.common import clock, plots, processes, program, shard_digests
from components.common.files import (
    check_writable,
    exists,
    filesystem,
    join,
    read_result,
    remove,
    write_bytes,
    write_json,
    write_text,
)
from components.common.local_copies import UnsafeKey
from components.common.model_folders import SAVED_MODEL
from components.common.repository import Repository, RepositoryError
from components.common.runtime_logs import program_environment, quiet_tensorflow_python
from components.common.shard_cache import CacheError, ShardCache
from components.common.shard_scan import counted, cut_short
from components.common.spans import SpanNotChecked, Spans
from components.common.store_errors import on_root
from components.common.tf_files import local_copy, push, tf_reads
from components.contracts import schema
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root, RunDir, Shard
from components.contracts.results import GateResult, ResultError, TrainMetrics
from components.contracts.run_config import RunConfig
from components.contracts.summaries import rollback_command
from components.gate import answers, correctness, reference, rule
from components.gate.decision import Decision, Floor, collapse, decide
from components.gate.evalset import eval_spans
from components.gate.labelset import known_classes, label_set_reasons
from components.gate.loading import named_unloadable
from components.gate.tfma import eval_config_for, label_name, read_tfma, run_tfma
from components.gate.unreadable_shards import named_corruption

# Loading the model, replaying the warm-up and, when there is one, starting the real server.
SERVING_CHECK_SECONDS = 15 * 60


class GateError(Exception):
    """A refusal with a message for the user (no traceback)."""


def run(argv: list[str] | None = None) -> int:
    args = program.stage_arguments("gate", argv)
    quiet_tensorflow_python()  # TFMA's reads of its own results call TensorFlow's deprecated record reader
    return program.main("stoke gate", args.json, on_root(lambda config, facts: gate(config, run_id=facts.run_id),
                                                         lambda: program.stage_config("gate", args)),
                        program.lines_of(GateResult), errors=(GateError, RepositoryError, ResultError, UnsafeKey, OSError))


@dataclasses.dataclass(frozen=True)
class Served:
    """The newest served version and how the candidate is compared with it."""
    version: int | None
    uri: str | None  # None when the candidate is not compared with it
    shared: list[str] | None  # the classes compared on, when the candidate added some
    notes: list[str]
    # Every retained version comparable with the candidate: version -> (uri, the ids of the classes both
    # answer), for the paired comparisons (the newest one's, and the best retained one's).
    retained: dict = dataclasses.field(default_factory=dict)
    refusals: list[str] = dataclasses.field(default_factory=list)  # the label-set rule's reasons
    held_to: reference.Chosen | None = None  # the reference; None: no version compared with


@dataclasses.dataclass(frozen=True)
class GateInputs:
    """What the gate reads before evaluating: the run, its eval records, the floor and the baseline."""
    run: RunDir
    candidate: str
    labels: list[str]
    spans: list[int]
    shards: list[Shard]
    counts: collections.Counter  # eval records per label id
    warm_images: list[bytes]
    majority_rate: float
    floor: Floor
    served: Served
    top_k: int
    warm: bool  # trained from the served model's weights: a warm run keeps its reference


def gate(config: RunConfig, *, run_id: str) -> dict:
    """Gathers the inputs, evaluates, decides and writes; returns gate.json's content."""
    inputs = gather(config, run_id)
    check_writable(inputs.run.uri)  # before TFMA's minutes, not after them
    results, serving = evaluate(config, inputs)
    metrics = dict(results["candidate"], majority_class_rate=inputs.majority_rate,
                   eval_label_counts={label_name(inputs.labels, k): v for k, v in sorted(inputs.counts.items())})
    held, notes = _reference_pair(inputs.served.held_to, results["answers"]) if config.gate.per_class else (None, [])
    decision = decide(metrics, results.get("baseline"), inputs.served.version, inputs.served.shared, inputs.floor,
                      config.gate.max_regression, serving, results["validation_ok"], results["validation_failures"],
                      rule.Evidence(config.gate.decision, config.gate.confidence, results["pairs"],
                                    inputs.labels if config.gate.per_class else None, held),
                      label_reasons=inputs.served.refusals)
    return write(config, inputs, metrics, results, serving, decision._replace(notes=notes + decision.notes))


def _reference_pair(chosen: reference.Chosen | None,
                    candidate: correctness.Answered) -> tuple[rule.Reference | None, list[str]]:
    """The reference's comparison with the candidate, on the records both answered, when it is not the newest
    served version; and what the gate says of the reference."""
    if chosen is None or chosen.recorded is None:
        return None, chosen.notes if chosen is not None else []
    pair = answers.paired(chosen.recorded, candidate.keys, candidate.labels, candidate.answers)
    if not pair[0]:
        return None, [*chosen.notes, f"the reference version {chosen.version} answered none of the eval records gated "
                      "on (each is known by its image's SHA-256 and label): class by class it is not compared"]
    return rule.Reference(chosen.version, chosen.pushed_at, chosen.days, chosen.since, pair), chosen.notes


def gather(config: RunConfig, run_id: str) -> GateInputs:
    """The run's metrics.json and candidate, its eval records, the accuracy floor and the baseline."""
    root = Root(config.root)
    run = root.run(run_id)
    if not exists(run.metrics):
        raise GateError(f"run {run_id} has no {run.metrics}: training did not finish there "
                            "(check --run-id and --root)")
    trained = read_result(run.metrics, TrainMetrics)
    candidate = run.candidate
    if not exists(join(candidate, SAVED_MODEL)):
        raise GateError(f"run {run_id} has no candidate SavedModel at {candidate}")
    labels = trained.labels
    try:  # every checked span's eval records, not only those training read (evalset.py)
        spans, left_out = eval_spans(root, trained.spans, trained.label_set)
        shards = Spans(root).shards("eval", spans)
    except SpanNotChecked as exc:  # held back since the run trained on it: its records are no evidence
        raise GateError(f"run {run_id} trained on a span the data check does not let in now: {exc}; "
                        "or train again without it") from None
    if not sum(s.records for s in shards):
        raise GateError(f"spans {spans}, those the data check lets in, have no eval records to gate "
                        f"run {run_id} on")
    shards, staged = _staged(config, shards)

    with named_corruption(shards, GateError):
        counts, warm_images = _scan_eval(shards, config.gate.warmup_images)
    majority_id, majority_count = counts.most_common(1)[0]
    majority_rate = majority_count / sum(counts.values())
    repo = Repository(root, config.model_name)
    served = _served(repo, trained.label_set)
    changed = environment_notes(trained, repo, served.version)
    return GateInputs(run=run, candidate=candidate, labels=labels, spans=spans, shards=shards, counts=counts,
                      warm_images=warm_images, majority_rate=majority_rate,
                      floor=_floor(config.gate.min_accuracy, majority_count, sum(counts.values()),
                                   label_name(labels, majority_id)),
                      served=dataclasses.replace(served, notes=served.notes + left_out + staged + changed),
                      top_k=min(config.gate.top_k, len(labels)),
                      warm=trained.start is not None and trained.start.kind == "warm")


def environment_notes(trained: TrainMetrics, repo: Repository, version: int | None) -> list[str]:
    """A note, never a reason, when the candidate was trained in another environment than the served version
    (the lineage's): what changed, or that the served version's environment is not recorded."""
    lineage = repo.lineage(version) if version is not None else None
    if lineage is None or trained.environment is None:
        return []  # nothing served, a version Stoke did not push, or a candidate trained before Stoke recorded it
    if lineage.environment is None:
        return [f"served version {version}: environment not recorded"]
    changed = trained.environment.changes_since(lineage.environment)
    return [f"trained in another environment than served version {version}: {'; '.join(changed)}"] if changed else []


def _staged(config: RunConfig, shards: list[Shard]) -> tuple[list[Shard], list[str]]:
    """The eval shards where TensorFlow and TFMA read them, each the file its manifest names (checked in place,
    or copied into the shard cache, which checks its copies), and a note when that is the shard cache."""
    try:
        if tf_reads(shards[0].uri):
            mismatched, staged = shard_digests.check(shards, config.shard_cache.dir).mismatched, None
        else:
            staged = ShardCache(config.shard_cache.dir, config.shard_cache.max_gb).stage(shards)
            mismatched = staged.mismatched
    except CacheError as exc:
        raise GateError(str(exc)) from None
    changed = [m for m in mismatched if not m.damaged]
    if changed:
        raise GateError(shard_digests.changed_spans(changed))
    if mismatched:
        raise GateError(f"corrupt eval shard: {'; '.join(map(str, mismatched))}; restore or re-ingest the span, "
                        "then gate again")
    if staged is None:
        return shards, []
    return staged.shards, [f"eval shards read through local copies in {staged.folder}: {staged.fetched} copied, "
                           f"{staged.reused} reused"]


def _floor(min_accuracy: float | None, majority_count: int, total: int, majority_label: str) -> Floor:
    """gate.min_accuracy when given; otherwise a model that learned nothing must never pass."""
    if min_accuracy is not None:
        return Floor(min_accuracy, True, "gate.min_accuracy", None, total=total)
    rate = majority_count / total
    return Floor(rate, False, f"must beat {rate:.4f} ({majority_count} of {total}), the share of the most common "
                              f"class ({majority_label}) in the eval split", majority_label, majority_count, total)


def _served(repo: Repository, candidate: LabelSet) -> Served:
    """The served version to compare with: on every class, on the classes both answer, or refused. It is
    the newest version TF Serving serves once the next push has set strangers aside (repository.py)."""
    found = repo.survey()
    version = found.versions[-1] if found.versions else None
    ignored = [f"{join(repo.uri, name)} is not compared with ({why}); the next push sets it aside"
               for name, why in found.strangers.items()]
    if version is None:
        return Served(None, None, None, ignored + ["no served version yet: only the accuracy floor applies"])
    lineages = {v: repo.lineage(v) for v in found.versions}
    known = {v: known_classes(lineage.label_set if lineage else None, candidate) for v, lineage in lineages.items()}
    retained = {v: (repo.version_uri(v), frozenset(map(candidate.labels.index, classes)))
                for v, classes in known.items() if classes is not None}
    served_labels = known[version]
    if served_labels is None:
        return Served(version, None, None, ignored,
                      refusals=label_set_reasons(lineages[version].label_set, candidate, version))
    chosen = reference.choose(repo, version, lineages[version], candidate, clock.now())
    if served_labels == candidate.answered:
        return Served(version, repo.version_uri(version), None, ignored, retained, held_to=chosen)
    added = [name for name in candidate.answered if name not in served_labels]
    return Served(version, repo.version_uri(version), served_labels, ignored + [
        f"the label set grew (served version {version} knows {len(served_labels)} classes, the "
        f"candidate added {', '.join(added)}): compared on the {len(served_labels)} classes both know"], retained,
        held_to=chosen)


def _damaged(which: str, config: RunConfig) -> str:
    """What to do about a version TensorFlow cannot load, as a command the user can run as printed:
    rollback takes out the newest version only, so a retained one is restored or moved by hand."""
    if which != "served":
        return "restore it, or move its folder out of the repository, then gate again"
    return f"restore it, or take it out of serving (`{rollback_command(config.root, config.model_name)}`), then gate again"


def evaluate(config: RunConfig, inputs: GateInputs) -> tuple[dict, dict]:
    """TFMA's results (candidate, and baseline when compared) and the serving check's report."""
    floor, served, run = inputs.floor, inputs.served, inputs.run
    with tempfile.TemporaryDirectory(prefix="stoke-gate-") as scratch:
        # Under `gate.decision: evidence` the paired interval judges the drop, so TFMA keeps only the floor:
        # its change threshold compares point estimates.
        eval_config = eval_config_for(floor.value + (0.0 if floor.inclusive else 1e-9), config.gate.max_regression,
                                      inputs.top_k, with_baseline=served.uri is not None,
                                      overall_change=served.shared is None and config.gate.decision == "point")
        models = {"candidate": local_copy(inputs.candidate, scratch, "candidate")}
        if served.uri:
            models["baseline"] = local_copy(served.uri, scratch, "baseline")
        versions = {version: (models["baseline"] if version == served.version else
                              local_copy(uri, scratch, f"version-{version}"), known)
                    for version, (uri, known) in served.retained.items()} if served.uri else {}
        suspects = {f"the candidate ({inputs.candidate})": (models["candidate"], "train again")}
        for version, (path, _) in versions.items():
            which = "served" if version == served.version else "retained"
            suspects[f"the {which} version {version} ({served.retained[version][0]})"] = (path, _damaged(which, config))
        # TFMA writes and reads its output through TensorFlow's file systems too.
        output = run.tfma if tf_reads(run.tfma) else os.path.join(scratch, "tfma")
        with named_unloadable(suspects, GateError), named_corruption(inputs.shards, GateError):
            run_tfma(eval_config, models, inputs.shards, output)
            results = read_tfma(output, inputs.labels, inputs.top_k)
            if output != run.tfma:
                push(output, run.tfma)
            results["answers"] = correctness.answered(models["candidate"], inputs.shards)
            results["pairs"] = correctness.pairs(results["answers"], versions, inputs.shards)

        _write_warmup(run.warmup, inputs.warm_images, config.model_name)
        serving = serving_check(models["candidate"], local_copy(run.warmup, scratch, "warmup"), config.model_name)
    return results, serving


def write(config: RunConfig, inputs: GateInputs, metrics: dict, results: dict, serving: dict,
          decision: Decision) -> dict:
    """The candidate's answers, gate.json, the confusion matrix and, last, the BLESSED or NOT_BLESSED marker."""
    run, floor, served = inputs.run, inputs.floor, inputs.served
    candidate = results["answers"]
    write_bytes(run.answers, answers.encode(answers.record(candidate.keys, candidate.labels, candidate.answers,
                                                           inputs.labels)))
    chosen = served.held_to
    held = None if chosen is None or chosen.version is None else {"version": chosen.version, "kept": inputs.warm}
    baseline = results.get("baseline")
    plot_uri = run.confusion_matrix
    plots.confusion_matrix(metrics["confusion_matrix"], inputs.labels, plot_uri,
                   title=f"{inputs.run.run_id}: accuracy {metrics['accuracy']:.3f}")
    validation = GateResult.model_validate({
        "run_id": inputs.run.run_id,
        "model_name": config.model_name,
        "blessed": decision.blessed,
        "reasons": decision.reasons,
        "notes": served.notes + decision.notes,
        "metrics": metrics,
        "baseline": baseline,
        "baseline_version": served.version if baseline is not None else None,
        "shared_classes": decision.shared_classes,
        "comparison": decision.comparison,
        "collapse": collapse(metrics, inputs.labels),
        "served_version": served.version,
        "reference": held,
        "thresholds": {"min_accuracy": floor.value, "min_accuracy_inclusive": floor.inclusive,
                       "min_accuracy_source": floor.source, "max_regression": config.gate.max_regression,
                       "compared_to_baseline": baseline is not None, "top_k": inputs.top_k},
        "serving_check": serving,
        "labels": inputs.labels,
        "spans": inputs.spans,
        "tfma_uri": run.tfma,
        "tfma_validation_ok": results["validation_ok"],
        "confusion_matrix_uri": plot_uri,
        "warmup_uri": run.warmup,
        "gate_uri": run.gate,
        "gated_at": clock.now(),
    })
    write_json(run.gate, validation.to_json())
    for marker in (run.blessed, run.not_blessed):
        if exists(marker):
            remove(marker)
    # The marker last: its presence means gate.json beside it is complete.
    write_text(run.blessed if decision.blessed else run.not_blessed, "\n".join(decision.reasons or ["blessed"]) + "\n")
    return validation.to_json()


def _scan_eval(shards, keep_images: int) -> tuple[collections.Counter, list[bytes]]:
    """Label counts of the eval split and the first images of distinct classes for warm-up; a shard TensorFlow
    reads short without an error (shard_scan.cut_short) stops the gate before any model is judged on part of it."""
    import tensorflow as tf

    spec = {schema.LABEL: schema.feature_spec()[schema.LABEL], schema.ENCODED: schema.feature_spec()[schema.ENCODED]}
    counts: collections.Counter = collections.Counter()
    images: list[tuple[int, bytes]] = []
    scans = []
    for shard in shards:
        records, read = tf.data.TFRecordDataset(shard.uri, compression_type=shard.compression).batch(256), 0
        for batch in records.map(lambda b: tf.io.parse_example(b, spec)).as_numpy_iterator():
            counts.update(int(v) for v in batch[schema.LABEL])
            read += len(batch[schema.LABEL])
            if len(images) < keep_images * 4:
                images.extend(zip((int(v) for v in batch[schema.LABEL]), batch[schema.ENCODED]))
        scans.append(counted(shard, read))
    if short := [scan for scan in scans if scan.cut_short]:
        raise GateError(cut_short(short))
    # Round-robin over classes so the warm-up batch looks like real traffic.
    by_class = collections.defaultdict(list)
    for label, encoded in images:
        by_class[label].append(bytes(encoded))
    chosen = []
    while len(chosen) < keep_images and any(by_class.values()):
        for label in sorted(by_class):
            if by_class[label] and len(chosen) < keep_images:
                chosen.append(by_class[label].pop(0))
    return counts, chosen


def _write_warmup(uri: str, images: list[bytes], model_name: str) -> None:
    from components.gate import warmup

    fs, path = filesystem(uri)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    records = warmup.prediction_logs(images, model_name, batch_sizes=(1, len(images)))
    fs.pipe_file(path, warmup.tfrecord_bytes(records))


def serving_check(model_dir: str, warmup_path: str, model_name: str) -> dict:
    """Runs components.gate.serving_check in a fresh process: nothing of this process's state helps it."""
    from components.common.serving import SERVING_IMAGE, SERVING_VERSION

    env = program_environment()
    env.pop("TF_USE_LEGACY_KERAS", None)
    try:
        result = processes.run(
            [sys.executable, "-m", "components.gate.serving_check", model_dir, "--warmup", warmup_path,
             "--model-name", model_name, "--serving-image", f"{SERVING_IMAGE}:{SERVING_VERSION}"],
            timeout=SERVING_CHECK_SECONDS, env=env)
        lines = result.stdout.strip().splitlines()
        why = None if result.returncode == 0 and lines else (result.stderr.strip().splitlines()[-1:] or ["no output"])[0]
    except subprocess.TimeoutExpired:
        why = f"it did not finish within {SERVING_CHECK_SECONDS} s"
    if why:
        return {"ok": False, "problems": [f"the SavedModel could not be served in a fresh process: {why}"],
                "real_server": {"status": "skipped", "reason": "the in-process check failed first"}}
    return json.loads(lines[-1])
