"""The `train` flow: new images in the bucket to a served model, one stage after the other.

    1 preflight  components.preflight   the machine: disks, read speed, GPUs, /dev/shm, limits
    2 ingest     beam_jobs.ingest       new files -> a new span of GZIP TFRecords (retried: it is exactly-once)
    2b datacheck components.datacheck   the new span against the published history; errors quarantine it,
                                        and training goes on with the other spans
    3 train      components.train       all published spans -> candidate SavedModel (tag `gpu`; never retried:
                                        a rerun of the same run id resumes from its backup instead)
    4 gate       components.gate        TFMA against thresholds and the served baseline -> blessed or not
    5 push       components.push        blessed only: a new integer version in the model repository
    6 report     components.report      report.md, report.json and plots in the run folder + Prefect artifacts

The stages, their programs, settings, results and timeouts are components/contracts/stages.py's.
Stages hand each other URIs under ROOT, never objects: each writes its summary to
ROOT/runs/<run-id>/summaries/<stage>.json, and the report is built from the run folder alone.
A refused model is a normal outcome: the flow completes and the report says why.
"""
from __future__ import annotations

import re

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run

from components.common.files import exists, filesystem, read_json, write_text
from components.contracts import results, summaries
from components.contracts.config import check_model_name
from components.contracts.layout import Root, RunDir, new_run_id
from components.contracts.stages import Stage, stage
from flows.parameters import (
    DEMO_ROOT,
    DEMO_SOURCE,
    BeamArgs,
    DataCheckSettings,
    GateSettings,
    IngestSettings,
    PreflightSettings,
    PushSettings,
    Timeouts,
    TrainSettings,
    check_beam_args,
    check_job_variables,
    deployment_beam_args,
    run_job_variables,
)
from flows.stages import StageError, run_stage, to_arguments

GPU_TAG = "gpu"
GPU_SLOTS = 1  # one training process owns all of a machine's GPUs (mirrored strategy)


def unless_timed_out(task, task_run, state) -> bool:
    """Retry a stage that failed (a bucket that did not answer), not one that ran out of time."""
    error = state.result(raise_on_failure=False)
    return not (isinstance(error, StageError) and error.timed_out)


@flow(name="train", description="preflight -> ingest -> datacheck -> train -> gate -> push -> report")
def train(
    source: str = DEMO_SOURCE,
    root: str = DEMO_ROOT,
    preflight: PreflightSettings | None = PreflightSettings(),
    ingest: IngestSettings = IngestSettings(),
    beam_args: BeamArgs = [],
    datacheck: DataCheckSettings = DataCheckSettings(),
    train: TrainSettings = TrainSettings(),
    gate: GateSettings = GateSettings(),
    push: PushSettings = PushSettings(),
    model_name: str = "stoke",
    skip_unchanged: bool = True,
    run_id: str | None = None,
    timeouts: Timeouts = Timeouts(),
    arrived: str = "",
    cache_dir: str | None = None,
    cache_max_gb: float = 100.0,
) -> dict:
    """Turns what is new in SOURCE into a span, trains on every span, and pushes a blessed model.
    `preflight: null` skips the machine checks; `arrived` (URIs, one a line, from bucket notifications)
    makes ingest read only those files. With ROOT on a store TensorFlow cannot read (s3://), training
    and the gate copy the shards into `cache_dir` (default: $STOKE_CACHE_DIR, else the temp directory),
    at most `cache_max_gb`."""
    check_job_variables(run_job_variables())  # before anything runs: no run chooses its command or env
    check_model_name(model_name)  # before anything is ingested or trained, as the run id below
    run = Root(root).run(run_id or flow_run_id())
    cache = cache_arguments(cache_dir, cache_max_gb)
    get_run_logger().info("run %s: %s -> %s", run.run_id, source, run.uri)
    ensure_gpu_limit()
    try:
        if preflight is not None:
            check_machine(source, root, preflight, run, timeouts.preflight, cache)            # 1
        ingested = ingest_span(source, root, ingest, beam_args, run, timeouts.ingest, arrived)  # 2
        held = ingested.published and check_span(root, ingested.span, datacheck, run,        # 2b
                                                 timeouts.datacheck).status == "quarantined"
        if skip_unchanged and (held or not ingested.published) and served_versions(root, model_name):
            what = held_back(root, ingested.span) if held else ingested.message or "nothing new"
            return write_report(run, skipped=f"{what}; model {model_name} is already served, so nothing was trained")
        if held and not Root(root).manifests():
            return write_report(run, skipped=f"{held_back(root, ingested.span)}, and no other span is left to train on")
        train_model(root, train, run, timeouts.train, cache)                                  # 3
        verdict = gate_model(root, model_name, gate, run, timeouts.gate, cache)               # 4
        if verdict.blessed:
            push_model(root, model_name, push, run, timeouts.push)                            # 5
        return write_report(run)                                                              # 6
    except Exception as error:
        write_report(run, failed=str(error), return_state=True)  # never hides the cause
        raise


# ---------------------------------------------------------------- stages


@task(name="preflight")  # no retries: a failed check fails again
def check_machine(source: str, root: str, settings: PreflightSettings, run: RunDir,
                  timeout_minutes: float, cache: list[str] = ()) -> summaries.PreflightSummary:
    """Checks disks, read speed, GPUs, /dev/shm and limits; stops the run on a failed check."""
    argv = ["--root", root, "--source", source, *cache, *to_arguments(settings)]
    try:
        summary = run_program(stage("preflight"), argv, run, timeout_minutes)
    except StageError as error:
        if error.summary is None:
            raise
        _log_checks(keep_summary(stage("preflight"), error.summary, run))
        raise PreflightFailed(f"{error}; fix it or run with preflight=None (`stoke run --no-preflight`)") from None
    _log_checks(summary)
    return summary


@task(name="ingest", retries=2, retry_delay_seconds=30, retry_condition_fn=unless_timed_out)
def ingest_span(source: str, root: str, settings: IngestSettings, beam_args: list[str], run: RunDir,
                timeout_minutes: float, arrived: str = "") -> summaries.IngestSummary:
    """Publishes what SOURCE holds beyond the published spans as a new span (or says nothing is new)."""
    argv = ingest_arguments(source, root, settings, beam_args)
    if arrived.strip():  # the files an arrival event named: ingest reads only those
        write_text(run.arrived, arrived.strip() + "\n")
        argv += ["--arrived", run.arrived]
    with Progress("ingest") as progress:
        return run_program(stage("ingest"), argv, run, timeout_minutes, progress)


@task(name="datacheck", retries=1, retry_delay_seconds=30, retry_condition_fn=unless_timed_out)
def check_span(root: str, span: int, settings: DataCheckSettings, run: RunDir,
               timeout_minutes: float) -> summaries.DataCheckSummary:
    """Compares the new span with the published history; an error quarantines it, not the run."""
    summary = run_program(stage("datacheck"), ["--root", root, "--span", str(span), *to_arguments(settings)], run,
                          timeout_minutes)
    logger = get_run_logger()
    for anomaly in summary.anomalies or []:
        logger.warning("datacheck %s: %s", anomaly.severity, anomaly.message)
    if summary.status == "quarantined":
        logger.warning("%s; training goes on without it", held_back(root, span))
    return summary


@task(name="train", tags=[GPU_TAG], retries=0)
def train_model(root: str, settings: TrainSettings, run: RunDir, timeout_minutes: float,
                cache: list[str] = ()) -> results.TrainMetrics:
    """Trains on every published span into ROOT/runs/<run-id>/candidate."""
    if exists(run.metrics):  # a retried flow run: this run's training already finished
        return keep_summary(stage("train"), read_json(run.metrics), run)
    with Progress("train") as progress:
        return run_program(stage("train"), ["--root", root, "--run-id", run.run_id, *cache, *to_arguments(settings)],
                           run, timeout_minutes, progress)


@task(name="gate", tags=[GPU_TAG], retries=1, retry_delay_seconds=30, retry_condition_fn=unless_timed_out)
def gate_model(root: str, model_name: str, settings: GateSettings, run: RunDir,
               timeout_minutes: float, cache: list[str] = ()) -> results.Validation:
    """Gates the candidate with TFMA: thresholds, and not worse than the served model."""
    summary = run_program(stage("gate"), ["--root", root, "--run-id", run.run_id, "--model-name", model_name,
                                          *cache, *to_arguments(settings)], run, timeout_minutes)
    reasons = "; ".join(summary.reasons)
    if summary.blessed:
        get_run_logger().info("blessed: %s", reasons or "all checks passed")
    else:
        get_run_logger().warning("not blessed, nothing will be pushed: %s", reasons)
    return summary


@task(name="push", retries=1, retry_delay_seconds=30, retry_condition_fn=unless_timed_out)
def push_model(root: str, model_name: str, settings: PushSettings, run: RunDir,
               timeout_minutes: float) -> summaries.PushSummary:
    """Pushes the blessed candidate as a new integer version of the served model."""
    return run_program(stage("push"), ["--root", root, "--run-id", run.run_id, "--model-name", model_name,
                                       *to_arguments(settings)], run, timeout_minutes)


@task(name="report", retries=1)
def write_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> dict:
    """Writes report.md, report.json and plots into the run folder and shows them as artifacts."""
    from components.report.report import write_report as build

    report = build(run, skipped=skipped, failed=failed)
    create_markdown_artifact(with_inline_plots(report["markdown"], report["summary"]["plots"]),
                             key=artifact_key("report", run), description=f"run report: {report['report_md']}")
    return report["summary"]


# ---------------------------------------------------------------- plumbing


class PreflightFailed(RuntimeError):
    pass


def flow_run_id() -> str:
    """The flow run's start and name: a retry of the same flow run keeps it, so training resumes."""
    return new_run_id(flow_run.scheduled_start_time, flow_run.name or "local")


def _log_checks(summary: summaries.PreflightSummary) -> None:
    logger = get_run_logger()
    for check in summary.checks:
        logger.log(30 if check.status in ("warn", "fail") else 20, "preflight %s %s: %s%s", check.status,
                   check.name, check.summary, f" (fix: {check.fix})" if check.fix else "")


def ensure_gpu_limit() -> None:
    """Creates the `gpu` tag concurrency limit when the server has none; a limit someone set is kept."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_concurrency_limit_by_tag(GPU_TAG)
        except ObjectNotFound:
            client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=GPU_SLOTS)


def held_back(root: str, span: int) -> str:
    """What the data check held back, and how to let it in."""
    return f"span {span} is quarantined by the data check (release it with `stoke spans release {span} --root {root}`)"


def served_versions(root: str, model_name: str) -> list[int]:
    """Complete integer versions in the model repository: what TF Serving would load."""
    from components.common.repository import Repository

    return Repository(root, model_name).versions()


def cache_arguments(cache_dir: str | None, cache_max_gb: float) -> list[str]:
    """The shard cache's options, the same for preflight, training and the gate."""
    return ([] if cache_dir is None else ["--cache-dir", cache_dir]) + ["--cache-max-gb", str(cache_max_gb)]


def ingest_arguments(source: str, root: str, settings: IngestSettings, beam_args: list[str]) -> list[str]:
    """The ingest program's arguments: the deployment's Beam options, then the run's (checked)."""
    return [source, "--root", root, *to_arguments(settings), *deployment_beam_args(), *check_beam_args(beam_args)]


def run_program(of: Stage, argv: list[str], run: RunDir, timeout_minutes: float,
                progress: Progress | None = None) -> dict:
    """Runs a stage's program (`python -m module argv --json`) and keeps its summary in the run folder."""
    summary = run_stage(of.name, of.program, [*argv, "--json"], timeout=timeout_minutes * 60,
                        logger=get_run_logger(), progress=progress)
    return keep_summary(of, summary, run)


def keep_summary(of: Stage, summary: dict, run: RunDir):
    """The summary as the stage's result model (a renamed key fails here, naming the program), kept
    in the run folder for the report."""
    result = of.result.check(summary, f"the summary of {of.program}")
    result.write(run.summary(of.name))
    return result


def with_inline_plots(markdown: str, plots: dict) -> str:
    """The report with its PNGs inlined: the Prefect UI cannot read files from ROOT."""
    import base64

    for uri in plots.values():
        fs, path = filesystem(uri)
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        if fs.exists(path) and fs.size(path) < 512 * 1024:
            data = base64.b64encode(fs.cat_file(path)).decode()
            markdown = markdown.replace(f"({name})", f"(data:image/png;base64,{data})")
    return markdown


def artifact_key(kind: str, run: RunDir) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{kind}-{run.run_id}".lower())[:100]


class Progress:
    """A Prefect progress artifact moved along by a stage program's progress events."""

    def __init__(self, stage: str):
        self.stage, self.artifact = stage, None

    def __enter__(self):
        self.artifact = create_progress_artifact(0.0, description=f"{self.stage} progress")
        return self

    def __call__(self, event: summaries.Progress) -> None:
        if event.fraction is not None:
            update_progress_artifact(self.artifact, min(100.0 * event.fraction, 99.0))

    def __exit__(self, kind, *rest):
        if kind is None:
            update_progress_artifact(self.artifact, 100.0)
