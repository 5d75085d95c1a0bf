"""The `train` flow: new images in the bucket to a served model, one stage after the other.

    0 config     ROOT/runs/<id>/config.json  the run configuration, resolved, before anything runs
    1 preflight  components.preflight   SOURCE, the machine: disks, read speed, GPUs, /dev/shm, limits
    2 ingest     beam_jobs.ingest       new files -> a new span of GZIP TFRecords (retried: it is exactly-once)
    2b datacheck components.datacheck   the new span against the published history; errors quarantine it,
                                        and training goes on with the other spans
    3 train      components.train       all published spans -> candidate SavedModel (tag `gpu`; never retried:
                                        a rerun of the same run id resumes from its backup instead)
    4 gate       components.gate        TFMA against thresholds and the served baseline -> blessed or not
    5 push       components.push        blessed only: a new integer version in the model repository
    6 report     components/report      report.md, report.json and plots in the run folder + Prefect artifacts

The flow's parameters are the fields of the run configuration (components/contracts/run_config.py),
plus the run id and the files an arrival event named. Each stage program gets its part of the
configuration as a file, ROOT/runs/<id>/config/<stage>.json, and hands back a JSON summary kept as
ROOT/runs/<id>/summaries/<stage>.json; stages pass each other URIs under ROOT, never objects, and
the report is built from the run folder alone. A refused model is a normal outcome: the flow
completes and the report says why.
"""
from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.runtime import flow_run

from components.common.files import exists, read_json, write_json, write_text
from components.contracts import overrides, results, summaries
from components.contracts.config import (
    DataCheckConfig,
    GateConfig,
    IngestConfig,
    PreflightConfig,
    PushConfig,
    ShardCacheConfig,
    TrainConfig,
)
from components.contracts.layout import Root, RunDir, new_run_id
from components.contracts.presets import PresetName
from components.contracts.run_config import RunConfig, Timeouts, stage_settings
from components.contracts.stages import Stage, stage
from components.preflight.source import NAME as SOURCE_CHECK
from flows.console import quiet_failures
from flows.parameters import check_job_variables, deployment_beam_args, registered_parameters, run_job_variables
from flows.programs import StageError, run_stage
from flows.reporting import ProgressArtifact, publish_report

GPU_TAG = "gpu"
GPU_SLOTS = 1  # one training process owns all of a machine's GPUs (mirrored strategy)


def only_transient(task, task_run, state) -> bool:
    """Retry a stage whose failure another try may not meet: its program said so (a store that did not
    answer, throttling, a reset connection: exit code 75) or a signal ended it (flows/programs.py). Never
    a deterministic one (a bad path, missing or refused credentials, a bad manifest or setting), which
    fails the same way 30 s later, nor one that ran out of time."""
    return bool(getattr(state.result(raise_on_failure=False), "transient", False))


@flow(name="train", description="preflight -> ingest -> datacheck -> train -> gate -> push -> report")
def pipeline(
    source: str,
    root: str,
    model_name: str = "stoke",
    preset: PresetName = "production",
    shard_cache: ShardCacheConfig = ShardCacheConfig(),
    beam_args: list[str] = [],
    timeouts: Timeouts = Timeouts(),
    preflight: PreflightConfig | None = PreflightConfig(),
    ingest: IngestConfig = IngestConfig(),
    datacheck: DataCheckConfig = DataCheckConfig(),
    train: TrainConfig = TrainConfig(),
    gate: GateConfig = GateConfig(),
    push: PushConfig = PushConfig(),
    skip_unchanged: bool = False,
    run_id: str | None = None,
    arrived: str = "",
) -> dict:
    """Turns what is new in SOURCE into a span, trains on every span, and pushes a blessed model.
    The parameters before `skip_unchanged` are the run configuration's (`stoke config show` lists them
    all). The others say why the run started: `skip_unchanged` ends it early, training nothing, when
    nothing is new and a model is served (the nightly and data-triggered runs); `run_id` resumes a
    stopped run; `arrived` (URIs, one a line, from bucket notifications) makes ingest read only those."""
    check_job_variables(run_job_variables())  # before anything runs: no run chooses its command or env
    given = {name: value for name, value in locals().items() if name in RunConfig.model_fields}
    config = configure(given)  # every setting checked before anything is ingested or trained
    try:
        run = Root(config.root).run(run_id or flow_run_id())
    except ValueError as error:  # a run id that would leave ROOT/runs
        raise ConfigurationError(str(error)) from None
    get_run_logger().info("run %s: %s -> %s (preset %s)", run.run_id, config.source, run.uri, config.preset)
    write_json(run.config, config.model_dump(mode="json"))
    ensure_gpu_limit()
    try:
        if config.preflight is not None:
            check_machine(config, run)                                                      # 1
        ingested = ingest_span(config, run, arrived)                                        # 2
        held = ingested.published and check_span(config, run, ingested.span).status == "quarantined"  # 2b
        if skip_unchanged and (held or not ingested.published) and served_versions(config):
            what = held_back(config.root, ingested.span) if held else ingested.message or "nothing new"
            return write_report(run, skipped=f"{what}; model {config.model_name} is already served, so nothing "
                                "was trained")
        if held and not Root(config.root).manifests():
            return write_report(run, skipped=f"{held_back(config.root, ingested.span)}, and no other span is left "
                                "to train on")
        train_model(config, run)                                                            # 3
        if gate_model(config, run).blessed:                                                 # 4
            push_model(config, run)                                                         # 5
        return write_report(run)                                                            # 6
    except Exception as error:
        write_report(run, failed=str(error), return_state=True)  # never hides the cause
        raise


def configure(given: dict) -> RunConfig:
    """The run's configuration, resolved: what this run was given, laid group by group over its
    deployment's (Prefect replaces a parameter whole, so `-p train='{"epochs": 3}'` alone would
    drop the deployment's other training settings)."""
    values = {name: value.model_dump(mode="json", exclude_unset=True) if hasattr(value, "model_dump") else value
              for name, value in given.items()}
    try:
        registered = {name: value for name, value in registered_parameters().items() if name in RunConfig.model_fields}
        return overrides.build(RunConfig, overrides.deep_merge(registered, values)).resolved()
    except overrides.ConfigError as error:
        raise ConfigurationError(str(error)) from None


# ---------------------------------------------------------------- stages


@task(name="preflight", retries=1, retry_delay_seconds=30, retry_condition_fn=only_transient)
def check_machine(config: RunConfig, run: RunDir) -> summaries.PreflightSummary:
    """Checks SOURCE, disks, read speed, GPUs, /dev/shm and limits; stops the run on a failed check."""
    try:
        summary = run_program(stage("preflight"), config, run)
    except StageError as error:
        if error.summary is None:
            raise
        failed = keep_summary(stage("preflight"), error.summary, run)
        _log_checks(failed)
        raise PreflightFailed(failed, error.transient) from None
    _log_checks(summary)
    return summary


@task(name="ingest", retries=2, retry_delay_seconds=30, retry_condition_fn=only_transient)
def ingest_span(config: RunConfig, run: RunDir, arrived: str = "") -> summaries.IngestSummary:
    """Publishes what SOURCE holds beyond the published spans as a new span (or says nothing is new)."""
    facts = {}
    if arrived.strip():  # the files an arrival event named: ingest reads only those
        write_text(run.arrived, arrived.strip() + "\n")
        facts["arrived"] = run.arrived
    with ProgressArtifact("ingest") as progress:
        return run_program(stage("ingest"), config, run, progress, beam_options(config), **facts)


@task(name="datacheck", retries=1, retry_delay_seconds=30, retry_condition_fn=only_transient)
def check_span(config: RunConfig, run: RunDir, span: int) -> summaries.DataCheckSummary:
    """Compares the new span with the published history; an error quarantines it, not the run."""
    summary = run_program(stage("datacheck"), config, run, span=span)
    logger = get_run_logger()
    for anomaly in summary.anomalies or []:
        logger.warning("datacheck %s: %s", anomaly.severity, anomaly.message)
    if summary.status == "quarantined":
        logger.warning("%s; training goes on without it", held_back(config.root, span))
    return summary


@task(name="train", tags=[GPU_TAG], retries=0)
def train_model(config: RunConfig, run: RunDir) -> results.TrainMetrics:
    """Trains on every published span into ROOT/runs/<run-id>/candidate."""
    if exists(run.metrics):  # a retried flow run: this run's training already finished
        return keep_summary(stage("train"), read_json(run.metrics), run)
    with ProgressArtifact("train") as progress:
        return run_program(stage("train"), config, run, progress, run_id=run.run_id)


@task(name="gate", tags=[GPU_TAG], retries=1, retry_delay_seconds=30, retry_condition_fn=only_transient)
def gate_model(config: RunConfig, run: RunDir) -> results.GateResult:
    """Gates the candidate with TFMA: thresholds, and not worse than the served model."""
    summary = run_program(stage("gate"), config, run, run_id=run.run_id)
    reasons = "; ".join(summary.reasons)
    if summary.blessed:
        get_run_logger().info("blessed: %s", reasons or "all checks passed")
    else:
        get_run_logger().warning("not blessed, nothing will be pushed: %s", reasons)
    return summary


@task(name="push", retries=1, retry_delay_seconds=30, retry_condition_fn=only_transient)
def push_model(config: RunConfig, run: RunDir) -> summaries.PushSummary:
    """Pushes the blessed candidate as a new integer version of the served model."""
    return run_program(stage("push"), config, run, run_id=run.run_id)


@task(name="report", retries=1)
def write_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> dict:
    """Writes report.md, report.json and plots into the run folder and shows them as artifacts."""
    return publish_report(run, skipped=skipped, failed=failed)


# ---------------------------------------------------------------- plumbing


class PreflightFailed(StageError):
    """A failed check, named with its finding and fix; retried when the store behind SOURCE did not answer."""

    def __init__(self, summary: summaries.PreflightSummary, transient: bool = False):
        first = next(check for check in summary.checks if check.status == "fail")
        reason = f"{first.name} failed: {first.summary}" + (f" (fix: {first.fix})" if first.fix else "")
        if first.name != SOURCE_CHECK:  # skipping the checks does not make SOURCE readable
            reason += "; fix it or skip the checks (`stoke run --no-preflight`, or preflight=null)"
        super().__init__(f"preflight failed: {reason}", summary.to_json(), stage="preflight", reason=reason,
                         transient=transient)


class ConfigurationError(ValueError):
    """Parameters that make no run configuration; the message names the setting."""


# On the terminal these failures are their one line; the engine's traceback of them stays in the run's log.
quiet_failures("train", errors=(StageError, ConfigurationError))


def run_program(of: Stage, config: RunConfig, run: RunDir, progress: ProgressArtifact | None = None,
                extra: list[str] = (), **facts):
    """Writes the stage's settings file into the run folder, runs its program on it
    (`python -m module --config FILE --json`) and keeps its summary in the run folder."""
    settings = run.stage_config(of.name)
    write_json(settings, stage_settings(of, config, **facts).model_dump(mode="json"))
    summary = run_stage(of.name, of.program, ["--config", settings, *extra, "--json"],
                        timeout=getattr(config.timeouts, of.name) * 60, logger=get_run_logger(), progress=progress)
    return keep_summary(of, summary, run)


def beam_options(config: RunConfig) -> list[str]:
    """Ingest's Beam options: the deployment's (runner, project: not part of the recorded configuration),
    then the run's (checked sizes, recorded)."""
    return [*deployment_beam_args(), *config.beam_args]


def keep_summary(of: Stage, summary: dict, run: RunDir):
    """The summary as the stage's result model (a renamed key fails here, naming the program), kept
    in the run folder for the report."""
    result = of.result.check(summary, f"the summary of {of.program}")
    result.write(run.summary(of.name))
    return result


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


def served_versions(config: RunConfig) -> list[int]:
    """Complete integer versions in the model repository: what TF Serving would load."""
    from components.common.repository import Repository

    return Repository(config.root, config.model_name).versions()
