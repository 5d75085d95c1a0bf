"""The `train` flow: new images in the bucket to a served model, one stage after the other.

    0 config     ROOT/runs/<id>/config.json  the run configuration, resolved, before anything runs
    1 preflight  components.preflight   SOURCE, the machine: disks, read speed, GPUs, /dev/shm, limits
    2 ingest     beam_jobs.ingest       new files -> a new span of GZIP TFRecords (retried: it is exactly-once)
    2b datacheck components.datacheck   every span not checked yet (the new one, one published by hand or by
                                        a run that died) against the history; errors quarantine it, and
                                        training goes on with the spans the check let in
       + the registry's other stages that run with the checks (Stage.runs "checks")
       (skip)                           nothing to train on, or (scheduled runs) every span the check let
                                        in is in the served model already
    3 train      components.train       all published spans -> candidate SavedModel (tag `gpu`; never retried:
                                        a rerun of the same run id resumes from its backup instead)
    4 gate       components.gate        TFMA against thresholds and the served baseline -> blessed or not
       + the registry's other stages that run with training ("training")
    5 push       components.push        blessed only: a new integer version in the model repository
       + the registry's other stages that run when blessed ("blessed")
    6 report     components/report      report.md, report.json and plots in the run folder + Prefect artifacts

The flow's parameters are the fields of the run configuration (components/contracts/run_config.py),
plus the run id and the files an arrival event named. The flow builds the one RunConfig once and records it
as ROOT/runs/<id>/config.json; each stage program reads that file whole (`--config`, with the facts of the
run beside it: `--run-id`, `--arrived`) and hands back its result, which is written once, as
ROOT/runs/<id>/<stage>.json (train's: metrics.json), by the program when it is given the run and by the flow
for the others; stages pass each other URIs under ROOT, never objects, and
the report is built from the run folder alone. A refused model is a normal outcome: the flow
completes and the report says why. In a deployment, a run that fails, and the `alerts.after`-th in a row that
pushes no model, say so as events, which the deployment's alerts send on (flows/alerts.py).

Credentials in SOURCE never reach a file, a command line or Prefect: the flow's `source` parameter is
SOURCE without them (`stoke run` and `stoke up` pass it so), the flow takes SOURCE itself from the
environment variable STOKE_SOURCE and hands it on the same way to the programs that read SOURCE
(components/contracts/secrets.py). An environment, unlike an argument, is readable only by the user
who runs the program, and fsspec reads a URL's user info as given (aiohttp's basic auth), for any store.
"""
from __future__ import annotations

import os
from contextlib import nullcontext

from prefect import flow, get_run_logger, task
from prefect.logging.loggers import flow_run_logger
from prefect.runtime import flow_run

from components.common import config_files, network_code
from components.common.files import exists, read_result, write_json, write_text, write_whole
from components.common.program import option, os_error_line, scrubbed, unwritable
from components.common.spans import Spans
from components.contracts import results, secrets, stages, summaries
from components.contracts.beam_options import BEAM_ARGS_ENV
from components.contracts.config import (
    AlertsConfig,
    DataCheckConfig,
    GateConfig,
    IngestConfig,
    PreflightConfig,
    PushConfig,
    RunsConfig,
    ShardCacheConfig,
    TrainConfig,
)
from components.contracts.layout import Root, RunDir, new_run_id
from components.contracts.presets import PresetName
from components.contracts.run_config import RunConfig, Timeouts, preset_problem
from components.contracts.stages import Stage, stage
from components.preflight.network import NAME as NETWORK_CHECK
from components.preflight.source import NAME as SOURCE_CHECK
from flows.alerts import alert_failed, alert_if_due
from flows.console import quiet_failures
from flows.gpu_slot import gpu_slot
from flows.lost_runs import running
from flows.parameters import (
    check_job_variables,
    check_network_choice,
    deployment_beam_args,
    refuse_webhook,
    registered_parameters,
    run_job_variables,
)
from flows.programs import StageError, run_stage
from flows.reporting import ProgressArtifact, prune_runs, publish_report

GPU_TAG = "gpu"  # the tasks that hold this machine's GPU slot (flows/gpu_slot.py), tagged for the UI


def only_transient(task, task_run, state) -> bool:
    """Retry a stage whose failure another try may not meet: its program said so (a store that did not
    answer, throttling, a reset connection: exit code 75) or a signal ended it (flows/programs.py). Never
    a deterministic one (a bad path, missing or refused credentials, a bad manifest or setting), which
    fails the same way 30 s later, nor one that ran out of time."""
    return bool(getattr(state.result(raise_on_failure=False), "transient", False))


def failure_alert(flow, failed_run, state) -> None:
    """The flow's on_failure hook: every failure (a stage's, a setting refused at run time, a timeout) said as
    `stoke.run.failed`, naming the run, its report and the one-line reason (flows/alerts.py). Parameters Prefect
    refused fail the run before it has a run context: its logger is had from the run itself."""
    alert_failed(flow_run_logger(failed_run, flow), failed_run.parameters.get("root"),
                 failed_run.parameters.get("run_id") or flow_run_id(), failure_line(state) or state.message or state.name,
                 state.name)


@flow(name="train", description="preflight -> ingest -> datacheck -> train -> gate -> push -> report",
      on_failure=[failure_alert])
def pipeline(
    source: str,
    root: str,
    model_name: str = "stoke",
    preset: PresetName = "production",
    shard_cache: ShardCacheConfig = ShardCacheConfig(),
    runs: RunsConfig = RunsConfig(),
    alerts: AlertsConfig = AlertsConfig(),
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
    networks: list[str] = [],
) -> dict:
    """Turns what is new in SOURCE into a span, trains on every span, and pushes a blessed model.
    The parameters before `skip_unchanged` are the run configuration's (`stoke config show` lists them
    all). The others say why the run started: `skip_unchanged` ends it early, training nothing, when the
    served model was trained on every span the data check lets in (the nightly and data-triggered runs);
    `run_id` resumes a stopped run; `arrived` (URIs, one a line, from bucket notifications) makes ingest
    read only those. `networks` is the deployment's: the networks of code a run's parameters may choose
    (`stoke deploy --network`), which a run cannot change."""
    check_job_variables(run_job_variables())  # before anything runs: no run chooses its command or env
    config = configure(  # every setting checked before anything is ingested or trained
        source=source, root=root, model_name=model_name, preset=preset, shard_cache=shard_cache, runs=runs,
        alerts=alerts, beam_args=beam_args, timeouts=timeouts, preflight=preflight, ingest=ingest, datacheck=datacheck,
        train=train, gate=gate, push=push)
    try:
        check_network_choice(config.train.network, networks)  # no run chooses code its deployment does not list
        refuse_webhook(alerts.webhook)  # nor a webhook, a secret Prefect would keep in the clear with its parameters
        run = Root(config.root).run(run_id or flow_run_id())
        config, code = network_code.for_run(config, run)  # a file network: its copy, read before anything is written
    except ValueError as error:  # a run id that would leave ROOT/runs; a network refused, or its file unreadable
        raise ConfigurationError(str(error)) from None
    get_run_logger().info("run %s: %s -> %s (preset %s)", run.run_id, secrets.recorded(config.source), run.uri,
                          config.preset)
    with running(config.root):  # and runs of ROOT that died without a word are said to have crashed
        write_json(run.config, recorded(config))
        for uri, data in code.items():  # the code config.json names, beside it: every stage reads this copy
            write_whole(uri, data)
        try:
            if config.preflight is not None:
                check_machine(config, run)                                                  # 1
            ingest_span(config, run, arrived)                                               # 2
            held = check_spans(config, run) if Spans(config.root).unchecked() else []         # 2b
            run_added("checks", config, run)
            skipped = nothing_to_train(config, held, skip_unchanged)
            if skipped:
                return alert_if_due(config, write_report(run, skipped=skipped))
            train_model(config, run)                                                        # 3
            blessed = gate_model(config, run).blessed                                       # 4
            run_added("training", config, run)
            if blessed:
                push_model(config, run)                                                     # 5
                run_added("blessed", config, run)
            return alert_if_due(config, write_report(run))                                  # 6
        except Exception as error:
            report = write_report(run, failed=failure_words(error), return_state=True)  # never hides the cause
            if report.is_failed():  # on a full disk, say: said, and the cause stays the run's last line
                get_run_logger().warning("the report could not be written: %s", failure_line(report))
            raise


def configure(**given) -> RunConfig:
    """The run's configuration, resolved: what this run was given, laid group by group over its
    deployment's (Prefect replaces a parameter whole, so `-p train='{"epochs": 3}'` alone would
    drop the deployment's other training settings)."""
    if set(given) != set(RunConfig.model_fields):  # a field of the configuration the flow's call left out
        raise TypeError(f"configure takes every field of RunConfig: {sorted(set(given) ^ set(RunConfig.model_fields))}")
    values = {name: value.model_dump(mode="json", exclude_unset=True) if hasattr(value, "model_dump") else value
              for name, value in given.items()}
    try:
        registered = {name: value for name, value in registered_parameters().items() if name in RunConfig.model_fields}
        config = config_files.build(RunConfig, config_files.deep_merge(registered, values)).resolved()
        hybrid = preset_problem(registered, config.preset, "the deployment's parameters") if registered else None
        if hybrid:
            raise config_files.ConfigError(hybrid)
        # A file network in the parameters was found where they were made (`stoke run`, `up`, `deploy`): its path
        # is absolute; one given relative is found in the working folder.
        config = network_code.located(config, os.getcwd(), trusted=True)
        config = config.model_copy(update={"source": secrets.given(config.source)})
    except (config_files.ConfigError, ValueError) as error:
        raise ConfigurationError(str(error)) from None
    # The stages read config.json, which holds no credential: only SOURCE's come back to them (STOKE_SOURCE),
    # so a setting the scrubber would change (a ROOT spelled like a credential) would send them elsewhere.
    whole, kept = config.model_dump(mode="json"), recorded(config)
    changed = [name for name in whole if name not in ("source", "beam_args") and kept[name] != whole[name]]
    if changed:
        raise ConfigurationError(f"{', '.join(changed)}: holds what reads as a credential, which the run's "
                                 "config.json leaves out, so its stages would not find it; name it without one")
    return config


def recorded(config: RunConfig) -> dict:
    """config.json: the resolved configuration, with any credential in SOURCE, ROOT or a Beam option
    left out, since the run folder is read by whoever may read the run: SOURCE as recorded (without its
    query), the rest scrubbed."""
    return {**scrubbed(config.model_dump(mode="json")), "source": secrets.recorded(config.source)}


# ---------------------------------------------------------------- stages


def stage_task(name: str):
    """Stage `name`'s task as its entry says: its name, `gpu` tag and retries (30 s apart, `only_transient`)."""
    of = stage(name)
    return task(name=of.name, tags=[GPU_TAG] if of.gpu else [], retries=of.retries, retry_delay_seconds=30,
                retry_condition_fn=only_transient)


@stage_task("preflight")
def check_machine(config: RunConfig, run: RunDir) -> summaries.PreflightSummary:
    """Checks SOURCE, disks, read speed, GPUs, /dev/shm and limits; stops the run on a failed check."""
    try:
        return run_program(stage("preflight"), config, run)
    except StageError as error:
        if error.summary is None:
            raise
        raise PreflightFailed(keep_result(stage("preflight"), error.summary, run), error.transient,
                              error.settings) from None


@stage_task("ingest")
def ingest_span(config: RunConfig, run: RunDir, arrived: str = "") -> summaries.IngestSummary:
    """Publishes what SOURCE holds beyond the published spans as a new span (or says nothing is new)."""
    facts = {}
    if arrived.strip():  # the files an arrival event named: ingest reads only those
        write_text(run.arrived, arrived.strip() + "\n")
        facts["arrived"] = run.arrived
    with ProgressArtifact("ingest") as progress:
        # The run's Beam options (sizes, recorded) on its command line; the deployment's (a runner's
        # credentials) in its environment, which only its user reads.
        return run_program(stage("ingest"), config, run, progress, config.beam_args,
                           env={BEAM_ARGS_ENV: deployment_beam_args()}, **facts)


@stage_task("datacheck")
def check_spans(config: RunConfig, run: RunDir) -> list[int]:
    """Checks every span not checked yet against the history; an error quarantines the span, not the run.
    Returns the spans it held back."""
    return [check.span for check in run_program(stage("datacheck"), config, run).held()]


def nothing_to_train(config: RunConfig, held: list[int], skip_unchanged: bool) -> str | None:
    """Why the run trains nothing (its report says "skipped"), or None: no span the data check let in;
    or, for a scheduled or data-triggered run, a served model trained on every span it let in."""
    spans = Spans(Root(config.root))
    # A span the check lets in by its record, which names the manifest it judged: (span, manifest SHA-256).
    checked = [(n, read.record.manifest_sha256) for n in spans.published() if (read := spans.check_record(n)).trusted]
    aside = "".join(f"; span {span} is quarantined by the data check (release it with "
                    f"`{summaries.release_command(span, config.root)}`)" for span in held)
    if not checked:
        return f"no span the data check let in to train on{aside}"
    served = served_spans(config)
    if skip_unchanged and served is not None and set(checked) <= served[1]:
        return (f"nothing new to train on: model {config.model_name} is already served (version {served[0]}), trained "
                f"on every span the data check let in ({', '.join(str(n) for n, _ in checked)}){aside}")
    return None


@stage_task("train")  # never retried: a rerun of the same run id resumes from its backup instead
def train_model(config: RunConfig, run: RunDir) -> results.TrainMetrics:
    """Trains on every published span into ROOT/runs/<run-id>/candidate, holding the GPU slot."""
    done = finished_training(run)
    if done is not None:  # a retried flow run
        return done
    with ProgressArtifact("train") as progress:
        return run_program(stage("train"), config, run, progress)


@stage_task("gate")
def gate_model(config: RunConfig, run: RunDir) -> results.GateResult:
    """Gates the candidate with TFMA, holding the GPU slot: thresholds, and not worse than the served model."""
    return run_program(stage("gate"), config, run)


@stage_task("push")
def push_model(config: RunConfig, run: RunDir) -> summaries.PushSummary:
    """Pushes the blessed candidate as a new integer version of the served model."""
    return run_program(stage("push"), config, run)


# The stages above, which the flow runs by name; every other stage of the registry runs at its place (`run_added`).
OWN = {own.name for own in (check_machine, ingest_span, check_spans, train_model, gate_model, push_model)}


def run_added(place: str, config: RunConfig, run: RunDir) -> None:
    """Runs the registry's other stages of `place` (Stage.runs), in its order, each as a task of its own."""
    for of in stages.STAGES:
        if of.runs == place and of.name not in OWN:
            stage_task(of.name)(run_program)(of, config, run)


def not_a_full_disk(task, task_run, state) -> bool:
    """Retry the report, unless its disk took no more: the next try would meet the same disk."""
    return unwritable(state.result(raise_on_failure=False)) is None


@task(name="report", retries=1, retry_condition_fn=not_a_full_disk)
def write_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> dict:
    """Prunes older run folders by the retention rule, then writes report.md, report.json and plots
    into the run folder and shows them as artifacts."""
    prune_runs(run)
    return publish_report(run, skipped=skipped, failed=failed)


# ---------------------------------------------------------------- plumbing


class PreflightFailed(StageError):
    """A failed check, named with its finding and fix; retried when the store behind SOURCE did not answer."""

    def __init__(self, summary: summaries.PreflightSummary, transient: bool = False, settings: bool = False):
        first = next(check for check in summary.checks if check.status == "fail")
        reason = f"{first.name} failed: {first.summary}" + (f" (fix: {first.fix})" if first.fix else "")
        if first.name not in (SOURCE_CHECK, NETWORK_CHECK):  # skipping the checks makes neither work
            reason += "; fix it or skip the checks (`--no-preflight`, or `--set preflight=null`)"
        super().__init__(f"preflight failed: {reason}", summary.to_json(), stage="preflight", reason=reason,
                         transient=transient, settings=settings)


class ConfigurationError(ValueError):
    """Parameters that make no run configuration; the message names the setting."""


# On the terminal these failures are their one line; the engine's traceback of them stays in the run's log. An
# OSError is the flow's own write into ROOT refused (a full or read-only disk), said as a stage program says it.
QUIET_FAILURES = (StageError, ConfigurationError, OSError)
quiet_failures("train", errors=QUIET_FAILURES)


def run_program(of: Stage, config: RunConfig, run: RunDir, progress: ProgressArtifact | None = None,
                extra: list[str] = (), env: dict[str, str] | None = None, **facts):
    """Runs the stage's program on the run's configuration and the `facts` of the run (`python -m module
    --config ROOT/runs/<id>/config.json --run-id ID --json`: the run id when the stage takes it), holding the
    GPU slot when its entry says so, and keeps its summary in the run folder. SOURCE with its credentials goes
    to the programs that read SOURCE, in their environment, and `env` to this one; the others (training, the
    gate...) get none of them."""
    facts = {"run_id": run.run_id, **facts} if "run_id" in of.inputs else facts
    given = [arg for name, value in facts.items() for arg in (option(name), str(value))]
    with gpu_slot(get_run_logger(), f"{of.name} of run {run.run_id}") if of.gpu else nullcontext() as slot:
        summary = run_stage(of.name, of.program, ["--config", run.config, *given, *extra, "--json"],
                            timeout=getattr(config.timeouts, of.name, of.timeout) * 60, logger=get_run_logger(),
                            progress=progress, env={secrets.SOURCE_ENV: config.source if "source" in of.inputs else "",
                                                    BEAM_ARGS_ENV: "", **(env or {})},
                            pass_fds=() if slot is None else (slot,))
    return keep_result(of, summary, run)


def keep_result(of: Stage, summary: dict, run: RunDir):
    """The summary as the stage's result model (a renamed key fails here, naming the program), its lines
    logged. A program given the run wrote it into the run folder itself; the others' is kept there for the report."""
    result = of.result.check(summary, f"the summary of {of.program}")
    if "run_id" not in of.inputs:  # a program given the run wrote it itself
        write_json(run.result(of.name), result.to_json())
    for level, line in result.log_lines():
        get_run_logger().log(level, "%s", line)
    return result


def finished_training(run: RunDir) -> results.TrainMetrics | None:
    """The run's training result when its training finished: metrics.json beside a whole candidate. A run
    pruned to its record keeps metrics.json without the candidate: that is not a run to gate."""
    if exists(run.metrics) and exists(run.saved_model):
        return read_result(run.metrics, results.TrainMetrics)
    return None


def failure_line(state) -> str | None:
    """A failed flow run's (or task run's) cause in one line: the stage and its own error (flows/programs.py
    StageError.line), else `failure_words`; None when its state holds no exception to say it."""
    try:
        error = state.result(raise_on_failure=False)
    except Exception:  # a result that cannot be read back says nothing
        return None
    return (getattr(error, "line", None) or failure_words(error)) if isinstance(error, Exception) else None


def failure_words(error: Exception) -> str:
    """A failure as the report says it: a refused write into ROOT as os_error_line says it (the path, and why:
    a full disk), anything else by its message."""
    return os_error_line(error) if isinstance(error, OSError) else str(error)


def refused_settings(state) -> bool:
    """Whether a failed flow run failed on its settings: a configuration refused, or a stage program that refused
    them (exit code 2: preflight's network check, say), before anything ran that a retry would need."""
    try:
        error = state.result(raise_on_failure=False)
    except Exception:  # a result that cannot be read back says nothing
        return False
    return isinstance(error, ConfigurationError) or bool(getattr(error, "settings", False))


def flow_run_id() -> str:
    """The flow run's start and name: a retry of the same flow run keeps it, so training resumes."""
    return new_run_id(flow_run.scheduled_start_time, flow_run.name or "local")


def served_spans(config: RunConfig) -> tuple[int, set[tuple[int, str]]] | None:
    """The newest served version and the spans it was trained on, each with its manifest's SHA-256 (its
    lineage); None when no version is served, or the newest has no lineage to say (then a run trains)."""
    from components.common.repository import Repository

    repository = Repository(config.root, config.model_name)
    version = repository.newest()
    lineage = repository.lineage(version) if version is not None else None
    return (version, lineage.trained_on()) if lineage is not None else None
