"""Raw images to a new span of sharded TFRecords, exactly once.

    python -m beam_jobs.ingest SOURCE --root ROOT [--shard-mb 128] [--runner DataflowRunner ...]

    driver: list SOURCE, drop what published spans already hold (beam_jobs/compare.py), stage the list
    Beam:   ReadSources -> Normalize -> WriteShards -> Gather   (beam_jobs/ingest_pipeline.py; job.py starts it)
            (+ each record's content signature)                         (components/common/signatures.py)
    driver: stage the published dHashes, so near-copies join their split  (beam_jobs/near_copies.py)
    driver: keep out copies of published or listed-twice images; near-copies of the arrival follow their
            original; odd sizes                                         (beam_jobs/duplicates.py, quality.py)
    driver: name the shards, dead_letter.jsonl, labels.json, the content and source indexes, the statistics
            (statistics/Split-*/FeatureStats.pb, beam_jobs/statistics.py), _MANIFEST.json last

Only the driver publishes, and only after the runner has finished, so a job that fails or is
killed leaves a staging folder that the next run removes, never a half-written span. Options that
this job does not know (`--runner`, `--project`, `--flink_master`, ...) pass through to Beam, after the
deployment's, which come in the environment (STOKE_BEAM_ARGS: components/contracts/beam_options.py).
"""
from __future__ import annotations

import collections
import gc
import itertools
import json
import logging
import os
import posixpath
import sys
import time
import uuid
from collections.abc import Callable, Iterator

from beam_jobs import bounded, quality
from beam_jobs.compare import compare
from beam_jobs.debris import STAGED_DEAD_LETTERS, STAGED_SHARDS, STAGING_PREFIX, MisplacedSpan, remove, remove_debris
from beam_jobs.duplicates import Findings, settle
from beam_jobs.job import JobFailed, run_pipeline, stage_sources
from beam_jobs.near_copies import stage_published
from beam_jobs.source_index import identity, write_source_index
from beam_jobs.sources import Source, each_listed, list_named
from beam_jobs.statistics import label_conflicts, write_statistics
from beam_jobs.unchanged import without_unchanged
from components.common import clock, program
from components.common.config_files import ConfigError, read_option_file
from components.common.content_index import write_index
from components.common.files import exists, filesystem, join, read_json, write_json, write_text
from components.common.lease import LeaseError, LeaseHeld, exclusive
from components.common.repository import RepositoryError, spans_named
from components.common.source_files import no_images
from components.common.spans import Spans
from components.common.store_errors import naming
from components.contracts import schema
from components.contracts.beam_options import BEAM_ARGS_ENV, deployment_options
from components.contracts.layout import Root, shard_name
from components.contracts.results import ResultError, SpanManifest
from components.contracts.run_config import RunConfig, RunFacts
from components.contracts.secrets import recorded, source_for_workers, without_secrets
from components.contracts.summaries import IngestSummary, Progress


class IngestError(Exception):
    """A job that cannot publish; the message says why and what to do."""


def ingest(config: RunConfig, pipeline_args: list[str], progress: Callable[[Progress], None] | None = None, *,
           arrived: str | None = None) -> IngestSummary:
    """Runs the whole job and returns its summary; raises IngestError when it cannot publish.
    `progress` gets the MB of new sources converted every few seconds while the runner works on this process's
    threads (beam_jobs/progress.py; default: a line on stderr);
    `arrived` names a file of the URIs bucket notifications announced, the only ones then read."""
    started = time.monotonic()
    root = Root(config.root)
    # One ingest at a time per ROOT: a second would pick the same span number and take the first's
    # staging folder for debris. An flock locally; on a bucket, a lease object that lapses when its
    # holder dies (components/common/lease.py).
    with naming(config.root):  # a bucket's refusal names the bucket and what to set (SOURCE's: in `listed`)
        try:
            with exclusive(root.ingest_lock, "ingest", wait=config.ingest.wait_minutes * 60,
                           waiting=lambda held: _waiting(root, held, config.ingest.wait_minutes)) as lease, \
                    source_for_workers(config.source):
                return _ingest(config, arrived, pipeline_args, root, started, lease,
                               progress or program.progress_printer(as_json=False))
        except LeaseHeld as error:
            detail = f" ({error})" if error.holder else ""
            still = f"is still writing into {root.uri} after {config.ingest.wait_minutes:g} min (ingest.wait_minutes)" \
                if config.ingest.wait_minutes else f"is writing into {root.uri}"
            raise IngestError(f"another ingest {still}; run again when it has finished{detail}") from None
        except LeaseError as error:
            raise IngestError(f"{error}; nothing was published") from None
        finally:
            gc.unfreeze()  # what loading Beam froze (_long_lived) is collectable again for a caller that goes on


def next_span(root: Root) -> int:
    """One more than any span number in use: the span folders (a killed job's among them) and every number a
    lineage in ROOT/models names, rolled-back and retired versions' too. A span folder deleted by hand leaves
    its number in the lineages of the models trained on it, and new records under that number would pass
    for those a model learnt."""
    try:
        named = spans_named(root)
    except RepositoryError as error:
        raise IngestError(f"{error}; nothing was published") from None
    return max([*Spans(root).span_numbers(), *named], default=0) + 1


def _waiting(root: Root, held: LeaseHeld, minutes: float) -> None:
    """Says why the job has not started: two runs that meet (a nightly one and one a notification started)
    take turns, the second finding only what the first did not publish."""
    print(f"stoke ingest: another ingest is writing into {root.uri} ({held}); waiting up to {minutes:g} min for it "
          "to finish", file=sys.stderr, flush=True)


def _ingest(config: RunConfig, arrived: str | None, pipeline_args: list[str], root: Root, started: float, lease,
            progress: Callable[[Progress], None]) -> IngestSummary:
    number = next_span(root)  # counted before debris goes: never reuse a name
    try:
        removed = remove_debris(root)
    except MisplacedSpan as error:
        raise IngestError(str(error)) from None

    entries = listed(config, arrived)
    shown = recorded(config.source)  # what the summary says: SOURCE without its credentials and query
    with naming(config.source):
        first = next(entries, None)  # a local folder is walked as it is compared: its first file, here
    if first is None and not arrived:  # notifications may name only sidecars: that is nothing new
        raise IngestError(no_images(config.source))
    comparison = compare(itertools.chain([first] if first else [], entries), root)  # streams: only what is new is kept
    refused = comparison.refused
    fresh, unchanged = without_unchanged(comparison.fresh, comparison.touched, root)
    if not fresh and not refused:
        touched = f" ({unchanged} with a new version but the same content, recognised by content)" if unchanged else ""
        return IngestSummary(published=False, span=None, new_sources=0, removed_debris=removed, unchanged=unchanged,
                             message=f"nothing new in {shown}: every image is already in a published span{touched}")

    labels = extended_labels(root, fresh)
    staging = join(root.spans, f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}")
    try:
        chunks = stage_sources(staging, fresh, labels)
        shards, dead, findings = _convert(root, staging, chunks, fresh, labels, config, pipeline_args, progress)
        dead += [{"uri": s.uri, "reason": r, "size": s.size, "version": s.version} for s, r in refused]
        copies = len(findings.dropped)
        if copies and copies == len(fresh) + len(refused):
            return IngestSummary(published=False, span=None, new_sources=copies, removed_debris=removed,
                                 duplicates=copies, message=f"nothing new in {shown}: {copies} new files, "
                                 "all copies of images already published (duplicates, kept out)",
                                 dead_letters=dead[:20])
        check(fresh, refused, shards, dead, config.ingest.max_bad_fraction, copies)
        if not sum(s["records"] for s in shards):  # every new file set aside: nothing to publish
            return IngestSummary(published=False, span=None, new_sources=len(fresh) + len(refused),
                                 removed_debris=removed, duplicates=copies, dead_letters=dead[:20],
                                 set_aside=set_aside_by_folder(dead),
                                 message=f"nothing to publish from {shown}: all {len(dead)} new files were "
                                 "set aside (reasons below)")
        lease.check()
        manifest = publish_or_withdraw(root, number, shards, dead, labels, fresh, refused, config, findings)
    finally:
        remove(staging)

    seconds = time.monotonic() - started
    return IngestSummary(
        published=True, span=number, span_uri=root.span(number), counts=manifest.counts,
        new_sources=len(fresh) + len(refused), bytes_in=sum(s.size for s in fresh),
        bytes_out=sum(s.bytes for s in manifest.shards), shards=len(manifest.shards), seconds=round(seconds, 3),
        images_per_sec=round(len(fresh) / seconds, 1) if seconds else None,
        dead_letters=dead[:20], dead_letter_uri=root.dead_letter(number), removed_debris=removed,
        unchanged=unchanged, duplicates=copies, set_aside=set_aside_by_folder(dead),
        anomalies=manifest.anomalies, near_duplicates=findings.near, quality=manifest.quality,
    )


def _convert(root, staging, chunks, fresh, labels, config, pipeline_args, progress):
    """Runs the Beam job over the fresh sources; returns the staged shards without duplicates,
    the dead letters (duplicates included) and what the duplicate check found."""
    if not fresh:
        return [], [], Findings(kept=[], dropped=[])
    published = stage_published(root, staging)  # so near-copies of published images join their split in the job
    try:
        run_pipeline(chunks, staging, config.ingest, pipeline_args, published, fresh, labels, progress)
    except JobFailed as error:
        raise IngestError(str(error)) from error
    dead = read_json(join(staging, STAGED_DEAD_LETTERS))
    shards, copies, findings = settle(staging, read_json(join(staging, STAGED_SHARDS)), fresh, root, config.ingest,
                                      published)
    return shards, dead + copies, findings


def listed(config: RunConfig, arrived: str | None = None) -> Iterator[tuple[Source, str | None]]:
    """What SOURCE holds: every file, or only those bucket notifications announced (--arrived);
    each with the reason it is refused, or None."""
    try:
        with naming(config.source):
            if arrived:
                return list_named(config.source, announced(arrived), config.ingest.eval_fraction).entries()
            return each_listed(config.source, config.ingest.eval_fraction, config.ingest.allow_outside_source)
    except (FileNotFoundError, PermissionError, ValueError) as error:
        raise IngestError(str(error)) from None


ARRIVED_BYTES = 256 * 1024 * 1024  # an --arrived file: some two million URIs


def announced(uri: str) -> list[str]:
    """The URIs of an --arrived file, one a line: a regular file of at most ARRIVED_BYTES."""
    text = read_option_file(uri, "--arrived", ARRIVED_BYTES)
    return [line.strip() for line in text.splitlines() if line.strip()]


def extended_labels(root: Root, fresh: list[Source]) -> list[str]:
    """The known labels with new class names appended: existing ids never change.

    Known means labels.json and every published manifest's list together, so a lost or stale
    labels.json cannot hand out an id twice; lists that give one id two names stop the job."""
    labels, origin = Spans(root).read_labels(), root.labels
    for manifest in Spans(root).each_manifest(checked=False, sources=False):
        names, uri = manifest.labels, root.manifest(manifest.span)
        for index, (mine, theirs) in enumerate(zip(labels, names)):
            if mine != theirs:
                raise IngestError(f"label id {index} is {mine!r} in {origin} but {theirs!r} in {uri}; "
                                  "ids must never change: restore labels.json from the spans' manifests")
        if len(names) > len(labels):
            labels, origin = list(names), uri
    return labels + sorted({s.label for s in fresh} - set(labels))


def check(fresh, refused, shards, dead, max_bad_fraction: float, duplicates: int = 0) -> None:
    """Every new source is in a shard or a dead letter, and not too many are bad: unreadable or broken
    files, over the sources that are not copies. Copies (`duplicates` of the dead letters) are good files
    already published, and images set aside for their quality (a dead camera's blank frames) are good
    files of a bad scene: neither fails the arrival, whose good images are published beside them."""
    records = sum(s["records"] for s in shards)
    if records + len(dead) != len(fresh) + len(refused):
        raise IngestError(f"{len(fresh) + len(refused)} new sources but {records} records and "
                          f"{len(dead)} dead letters; nothing was published")
    culprits = [d for d in dead if dead_letter_kind(d["reason"]) == "bad"]
    total, bad = len(fresh) + len(refused) - duplicates, len(culprits)
    if total and bad / total > max_bad_fraction:
        reasons = "; ".join(f"{d['uri']}: {d['reason']}" for d in culprits[:3])
        raise IngestError(
            f"{bad} of {total} new sources ({bad / total:.1%}, copies aside) are unreadable or broken, more than "
            f"ingest.max_bad_fraction {max_bad_fraction}; nothing was published. First: {reasons}")


# What a dead letter's reason says it is: a copy (or near-copy) of a published or listed image, an image
# set aside for its quality, or a bad file (unreadable, broken, too large, not an image, no label...).
COPY_REASONS, QUALITY_REASONS = ("duplicate of", "near-copy of"), ("blank image", *quality.WORDS.values())


def dead_letter_kind(reason: str) -> str:
    return "copy" if reason.startswith(COPY_REASONS) else "quality" if reason.startswith(QUALITY_REASONS) else "bad"


def set_aside_by_folder(dead: list[dict], most: int = 5) -> dict[str, int]:
    """Images set aside for their quality, counted by their folder (the `most` fullest): a dead camera's
    blank (or dark, blurry...) frames come from its folder."""
    folders = collections.Counter(posixpath.dirname(d["uri"]) for d in dead if dead_letter_kind(d["reason"]) == "quality")
    return dict(folders.most_common(most))


def publish_or_withdraw(root: Root, number: int, *details) -> SpanManifest:
    """Publishes the span, or removes what a failed write (a full disk) left of it: before its
    manifest lands the folder was never published, so no reader can hold it."""
    try:
        return publish(root, number, *details)
    except OSError as error:
        if not exists(root.manifest(number)):
            remove(root.span(number))
        raise IngestError(f"{program.os_error_line(error)}; nothing was published") from None


def publish(root, number, shards, dead, labels, fresh, refused, config, findings) -> SpanManifest:
    """Moves the shards to their names, then writes dead letters, the content index and the
    statistics and, last, the manifest."""
    span, sources = root.span(number), fresh + [source for source, _ in refused]
    fs, span_path = filesystem(span)
    fs.makedirs(span_path, exist_ok=True)
    named = []
    for split in schema.SPLITS:
        files = sorted((s for s in shards if s["split"] == split), key=lambda s: s["file"])
        for index, shard in enumerate(files):
            name = shard_name(split, index, len(files), config.ingest.compression)
            fs.mv(filesystem(shard["file"])[1], filesystem(join(span, name))[1])
            named.append({"file": name, "split": split, **{k: shard[k] for k in ("records", "bytes", "sha256")}})
    if labels != Spans(root).read_labels():
        write_json(root.labels, labels)
    write_text(root.dead_letter(number), "".join(json.dumps({**d, "reason": without_secrets(d["reason"])},
                                                            ensure_ascii=False) + "\n" for d in dead))
    write_index(root.content_index(number), findings.kept)
    write_source_index(root.source_index(number), (identity(s.uri, s.size, s.version) for s in sources))
    anomalies = label_conflicts(findings.conflicts)
    write_statistics(root, number, findings.kept, anomalies, labels)
    manifest = SpanManifest(
        span=number,
        created=clock.now(),
        source=recorded(config.source),
        compression=config.ingest.compression,
        counts={**{split: sum(s["records"] for s in named if s["split"] == split) for split in schema.SPLITS},
                "dead_letter": len(dead), "duplicates": len(findings.dropped)},
        labels=labels,
        shards=named,
        sources=[{"uri": s.uri, "size": s.size, "version": s.version} for s in sources],
        settings=config.ingest.model_dump(),
        max_side=config.ingest.max_side or None,
        anomalies=anomalies,
        quality=quality.findings(findings.kept),
        same_picture=findings.same_picture,
    )
    write_json(root.manifest(number), manifest.to_json())
    return manifest


# ---------------------------------------------------------------- plumbing


def run(argv: list[str] | None = None) -> int:
    parser = program.stage_parser("ingest", positional=("source",))
    parser.epilog = (f"Other options (--runner, --project, --region, --flink_master, ...) go to Apache Beam, after the "
                     f"deployment's in the environment variable {BEAM_ARGS_ENV}.")
    args, pipeline_args = parser.parse_known_args(argv)
    if not os.environ.get("STOKE_DEBUG"):
        # Beam relays every worker's log lines; the summary says what matters.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    code = program.main("stoke ingest", args.json,
                        lambda: _run(program.stage_config("ingest", args), pipeline_args, args.json),
                        program.lines_of(IngestSummary),
                        errors=(IngestError, ResultError, OSError), failed=IngestSummary(published=False))
    # The interpreter's collections at exit walk Beam's 300,000 objects several times over (a second after
    # the summary on 2 cores) to free memory the exit frees anyway: frozen, they are left out.
    gc.freeze()
    return bounded.exit_code(code)


def _run(found: tuple[RunConfig, RunFacts], pipeline_args: list[str], as_json: bool) -> IngestSummary:
    config, facts = found
    try:
        deployment = deployment_options(os.environ.get(BEAM_ARGS_ENV, ""))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return ingest(config, [*deployment, *pipeline_args], program.progress_printer(as_json), arrived=facts.arrived)


if __name__ == "__main__":
    sys.exit(run())
