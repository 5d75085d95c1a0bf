"""The `train` flow: new images in the bucket to a served model, one stage after the other.

    1 preflight  components.preflight   the machine: disks, read speed, GPUs, /dev/shm, limits
    2 ingest     beam_jobs.ingest       new files -> a new span of GZIP TFRecords (retried: it is exactly-once)
    3 train      components.train       all published spans -> candidate SavedModel (tag `gpu`; never retried:
                                        a rerun of the same run id resumes from its backup instead)
    4 validate   components.gate    TFMA against thresholds and the served baseline -> blessed or not
    5 push       components.push        blessed only: a new integer version in the model repository
    6 report     components.report      report.md, report.json and plots in the run folder + Prefect artifacts

Stages hand each other URIs under ROOT, never objects: each writes its summary to
ROOT/runs/<run-id>/summaries/<stage>.json, and the report is built from the run folder alone.
A refused model is a normal outcome: the flow completes and the report says why.
"""
from __future__ import annotations

import re

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run

from components.common.files import exists, filesystem, write_json
from components.contracts.layout import Root, RunDir
from components.contracts.results import TrainMetrics
from flows.parameters import (
    DEMO_EPOCHS,
    DEMO_ROOT,
    DEMO_SOURCE,
    BeamArgs,
    DoctorSettings,
    GateSettings,
    IngestSettings,
    ModelSettings,
    PushSettings,
    Timeouts,
    check_beam_args,
    deployment_beam_args,
)
from flows.stages import StageError, run_stage, to_arguments

GPU_TAG = "gpu"
GPU_SLOTS = 1  # one training process owns all of a machine's GPUs (mirrored strategy)


def unless_timed_out(task, task_run, state) -> bool:
    """Retry a stage that failed (a bucket that did not answer), not one that ran out of time."""
    error = state.result(raise_on_failure=False)
    return not (isinstance(error, StageError) and error.timed_out)


@flow(name="train", description="preflight -> ingest -> train -> validate -> push -> report")
def train(
    source: str = DEMO_SOURCE,
    root: str = DEMO_ROOT,
    epochs: int = DEMO_EPOCHS,
    model: ModelSettings = ModelSettings(),
    gate: GateSettings = GateSettings(),
    push: PushSettings = PushSettings(),
    ingest: IngestSettings = IngestSettings(),
    beam_args: BeamArgs = [],
    model_name: str = "stoke",
    preflight: bool = True,
    doctor: DoctorSettings = DoctorSettings(),
    skip_unchanged: bool = True,
    run_id: str | None = None,
    timeouts: Timeouts = Timeouts(),
) -> dict:
    """Turns what is new in SOURCE into a span, trains on every span, and pushes a blessed model."""
    run_id = run_id or new_run_id()
    run = Root(root).run(run_id)
    get_run_logger().info("run %s: %s -> %s", run_id, source, run.uri)
    ensure_gpu_limit()
    try:
        if preflight:
            check_machine(source, root, doctor, run)                            # 1
        ingested = ingest_span(source, root, ingest, beam_args, run, timeouts.ingest)  # 2
        if skip_unchanged and not ingested["published"] and served_versions(root, model_name):
            return write_report(run, skipped=f"{ingested.get('message', 'nothing new')}; "
                                f"model {model_name} is already served, so nothing was trained")
        train_model(root, epochs, model, run, timeouts.train)                       # 3
        validation = validate_model(root, model_name, gate, run, timeouts.validation)  # 4
        if validation["blessed"]:
            push_model(root, model_name, push, run, timeouts.push)                  # 5
        return write_report(run)                                                    # 6
    except Exception as error:
        write_report(run, failed=str(error), return_state=True)  # never hides the cause
        raise


# ---------------------------------------------------------------- stages


@task(name="preflight")  # no retries: the checks never raise, and a failed check fails again
def check_machine(source: str, root: str, settings: DoctorSettings, run: RunDir) -> dict:
    """Checks disks, read speed, GPUs, /dev/shm and limits; stops the run on a failed check."""
    from components.preflight.doctor import run_checks

    report = run_checks(root, source=source, require_gpu=settings.require_gpu,
                        min_read_mbps=settings.min_read_mbps, sample_mb=settings.sample_mb)
    summary = report.to_dict()
    save_summary(run, "preflight", summary)
    logger = get_run_logger()
    for check in report.checks:
        logger.log(30 if check.status in ("warn", "fail") else 20, "preflight %s %s: %s%s", check.status,
                   check.name, check.summary, f" (fix: {check.fix})" if check.fix else "")
    if report.failed:
        raise PreflightFailed(f"preflight: {report.failure_line()}; fix it or run with preflight=False "
                              "(`stoke run --no-preflight`)")
    return summary


@task(name="ingest", retries=2, retry_delay_seconds=30, retry_condition_fn=unless_timed_out)
def ingest_span(source: str, root: str, settings: IngestSettings, beam_args: list[str], run: RunDir,
                timeout_minutes: float) -> dict:
    """Publishes what SOURCE holds beyond the published spans as a new span (or says nothing is new)."""
    with Progress("ingest", INGEST_PROGRESS) as progress:
        return run_program("ingest", "beam_jobs.ingest", ingest_arguments(source, root, settings, beam_args),
                           run, timeout_minutes, progress)


@task(name="train", tags=[GPU_TAG], retries=0)
def train_model(root: str, epochs: int, settings: ModelSettings, run: RunDir, timeout_minutes: float) -> dict:
    """Trains on every published span into ROOT/runs/<run-id>/candidate."""
    if exists(run.metrics):  # a retried flow run: this run's training already finished
        summary = TrainMetrics.read(run.metrics).to_json()
        save_summary(run, "train", summary)
        return summary
    with Progress("train", EPOCH_PROGRESS) as progress:
        return run_program("train", "components.train", ["--root", root, "--run-id", run.run_id,
                           "--epochs", str(epochs), *to_arguments(settings)], run, timeout_minutes, progress)


@task(name="validate", tags=[GPU_TAG], retries=1, retry_delay_seconds=30, retry_condition_fn=unless_timed_out)
def validate_model(root: str, model_name: str, settings: GateSettings, run: RunDir, timeout_minutes: float) -> dict:
    """Gates the candidate with TFMA: thresholds, and not worse than the served model."""
    summary = run_program("validate", "components.gate", ["--root", root, "--run-id", run.run_id,
                          "--model-name", model_name, *to_arguments(settings)], run, timeout_minutes)
    reasons = "; ".join(summary["reasons"])
    if summary["blessed"]:
        get_run_logger().info("blessed: %s", reasons or "all checks passed")
    else:
        get_run_logger().warning("not blessed, nothing will be pushed: %s", reasons)
    return summary


@task(name="push", retries=1, retry_delay_seconds=30, retry_condition_fn=unless_timed_out)
def push_model(root: str, model_name: str, settings: PushSettings, run: RunDir, timeout_minutes: float) -> dict:
    """Pushes the blessed candidate as a new integer version of the served model."""
    return run_program("push", "components.push", ["--root", root, "--run-id", run.run_id,
                       "--model-name", model_name, *to_arguments(settings)], run, timeout_minutes)


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


def new_run_id() -> str:
    """Start time plus the flow run's name: a retry of the same flow run keeps it, so training resumes."""
    start = flow_run.scheduled_start_time
    name = flow_run.name or "local"
    return f"{start:%Y%m%d-%H%M%S}-{name}"


def ensure_gpu_limit() -> None:
    """Creates the `gpu` tag concurrency limit when the server has none; a limit someone set is kept."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_concurrency_limit_by_tag(GPU_TAG)
        except ObjectNotFound:
            client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=GPU_SLOTS)


def served_versions(root: str, model_name: str) -> list[int]:
    """Complete integer versions in the model repository: what TF Serving would load."""
    from components.common.repository import Repository

    return Repository(root, model_name).versions()


def ingest_arguments(source: str, root: str, settings: IngestSettings, beam_args: list[str]) -> list[str]:
    """The ingest program's arguments: the deployment's Beam options, then the run's (checked)."""
    return [source, "--root", root, *to_arguments(settings), *deployment_beam_args(), *check_beam_args(beam_args)]


def run_program(stage: str, module: str, argv: list[str], run: RunDir, timeout_minutes: float,
                progress: Progress | None = None) -> dict:
    """Runs a stage program (`python -m module argv --json`) and keeps its summary in the run folder."""
    summary = run_stage(stage, module, [*argv, "--json"], timeout=timeout_minutes * 60, logger=get_run_logger(),
                        progress=progress)
    save_summary(run, stage, summary)
    return summary


def save_summary(run: RunDir, stage: str, summary: dict) -> None:
    write_json(run.summary(stage), summary)


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


INGEST_PROGRESS = re.compile(r"ingest: ([\d,.]+) of ([\d,.]+) MB written")
EPOCH_PROGRESS = re.compile(r"^Epoch (\d+)/(\d+)")


class Progress:
    """A Prefect progress artifact moved along by a stage's output lines that match `pattern`
    (two numbers: done and total)."""

    def __init__(self, stage: str, pattern: re.Pattern):
        self.stage, self.pattern, self.artifact = stage, pattern, None

    def __enter__(self):
        self.artifact = create_progress_artifact(0.0, description=f"{self.stage} progress")
        return self

    def __call__(self, line: str) -> None:
        match = self.pattern.search(line)
        if match:
            done, total = (float(g.replace(",", "")) for g in match.groups())
            if self.pattern is EPOCH_PROGRESS:
                done -= 1  # "Epoch 3/5" starts the third epoch
            if total > 0:
                update_progress_artifact(self.artifact, min(100.0 * done / total, 99.0))

    def __exit__(self, kind, *rest):
        if kind is None:
            update_progress_artifact(self.artifact, 100.0)
