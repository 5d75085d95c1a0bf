"""The run report: what one run did, built from its run folder alone.

Reads each stage's result, ROOT/runs/<run-id>/<stage>.json (train's: metrics.json), through the stage
registry, and writes report.json, report.md and the confusion-matrix plot next to them; the training
curves (curves.png) are the trainer's. The orchestrator shows the same markdown; nothing here knows
about it, so `write_report` can rebuild the report of any run, also one that failed halfway.
"""
from __future__ import annotations

import json
import logging
import os

from components.common import plots as draw
from components.common.files import exists, read_json, read_result, write_json, write_whole
from components.common.program import printable, scrubbed
from components.common.spans import Spans
from components.contracts import stages
from components.contracts.config import network_parts
from components.contracts.layout import CODE, Root, RunDir
from components.contracts.results import (
    Comparison,
    GateMetrics,
    GateResult,
    PerClassComparison,
    ReferenceComparison,
    TrainMetrics,
)
from components.contracts.retention import RetentionSummary
from components.contracts.summaries import PushSummary, RunReport, StageSection
from components.report import data_section
from components.report.headline import alerts
from components.report.input_verdict import figure, verdict

# The keys of a stage's summary that its section of the report shows.
INGEST_KEYS = {"published", "span", "span_uri", "counts", "new_sources", "images_per_sec", "seconds",
               "dead_letters", "dead_letter_uri", "message", "error", "duplicates", "near_duplicates", "set_aside",
               "quality"}
PUSH_KEYS = {"pushed", "already_pushed", "version", "previous_version", "model_uri", "model_card", "serving_uri",
             "commands", "image", "retired", "set_aside", "message"}


def build_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> RunReport:
    """The report: one section per stage that left a result, its own (a field of RunReport named after the
    stage) or, for another stage of the registry, its result in one line and its warnings."""
    present = {s.name: read_result(run.result(s.name), s.result) for s in stages.STAGES if exists(run.result(s.name))}
    preflight, ingest, datacheck = present.get("preflight"), present.get("ingest"), present.get("datacheck")
    train, gate, push = present.get("train"), present.get("gate"), present.get("push")
    status, message = _outcome(gate, push, skipped, failed)
    for check in datacheck.held() if datacheck is not None and not skipped else []:
        message += f" Span {check.span} was held back: the data check quarantined it (see Data check)."
    pushed = _pushed(push)
    config = read_json(run.config) if exists(run.config) else None
    report = RunReport(
        run_id=run.run_id, run_dir=run.uri, stages=list(present),
        status=status, message=message, alerts=alerts(gate, train, config, _train_records(run, train), ingest),
        # The headline, with the same keys as `stoke run --json`: blessed, pushed_version, reasons, metrics.
        blessed=bool(gate and gate.blessed),
        pushed_version=push.version if pushed else None,
        reasons=gate.reasons if gate else [],
        metrics=gate.metrics.model_dump(include={"accuracy", "top_k_accuracy", "example_count",
                                                 "majority_class_rate"}) if gate else {},
        model_uri=push.model_uri if pushed else None,
        plots={}, report_md=run.report_md, report_json=run.report_json,
        config=config, config_json=run.config if config is not None else None,
    )
    if ingest is not None:
        report.ingest = ingest.model_dump(include=INGEST_KEYS, exclude_none=True)
    if train is not None:
        probe = train.input
        report.train = {
            **train.model_dump(include={
                "network", "spans", "epochs", "total_steps", "strategy", "precision", "xla", "replicas",
                "global_batch_size", "images_per_sec", "train", "eval", "model_dir", "resumed_from_step", "weights",
                "phases", "start", "network_digest", "environment"}),
            "input_bound": probe.input_bound,
            "input_images_per_sec": probe.input_images_per_sec,
            "model_images_per_sec": probe.model_images_per_sec_synthetic,
            "input_wait_seconds": probe.input_wait_seconds,
            "verdict": verdict(probe, train.image_size),
            "profiler": train.profiler,
            "data_service": train.data_service,
            **({"shards": _staging(train.staging, preflight)} if train.staging else {}),
        }
    if gate is not None:
        report.gate = gate.model_dump(include={
            "blessed", "reasons", "notes", "metrics", "labels", "thresholds", "baseline_version", "gate_uri",
            "comparison"})
    if push is not None:
        report.push = push.model_dump(include=PUSH_KEYS)
    report.datacheck = datacheck
    report.sections = {name: StageSection(summary=result.in_words(), warnings=[
        line for level, line in result.log_lines() if level >= logging.WARNING])
        for name, result in present.items() if name not in OWN_SECTIONS}
    report.unserved_spans = _unserved(run, config)
    report.run_folders = _run_folders(run, report.alerts)
    report.plots = {**_plots(run, report, train, gate), **data_section.plot(run, datacheck)}
    return report


def write_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> dict:
    """Builds the report and writes report.json, report.md and plots into the run folder.

    Returns {"summary": the report as JSON, "markdown": report.md's text, "report_md": its URI}."""
    # Without credentials: a span or version published before Stoke kept them out may still hold SOURCE's.
    report = RunReport.model_validate(scrubbed(build_report(run, skipped, failed).to_json()))
    # Names in the markdown cannot carry escapes.
    markdown = render_markdown(RunReport.model_validate(printable(report.to_json())))
    write_whole(run.report_md, markdown.encode())
    write_json(run.report_json, report.to_json())
    return {"summary": report.to_json(), "markdown": markdown, "report_md": report.report_md}


def _staging(staging: dict | None, preflight) -> str | None:
    """The shard cache's work in words, beside the read speed preflight measured under ROOT."""
    if not staging:
        return None
    read = next((c.facts.get("mbps") for c in preflight.checks if c.name == "read throughput"), None) if preflight else None
    speed = f" at {staging['mb_per_sec']:,.1f} MB/s" if staging.get("mb_per_sec") else ""
    return (f"{staging['shards']} staged into the local cache `{staging['folder']}` in {staging['seconds']:.2f} s: "
            f"{staging['fetched']} copied ({staging['mb_fetched']:,.1f} MB{speed}), {staging['reused']} reused"
            + (f"; preflight read ROOT at {read:,.1f} MB/s" if read else ""))


def render_markdown(report: RunReport) -> str:
    """report.md: the outcome and alerts, then each stage's section in the registry's order (its own, or the
    generic one: its result in a line and its warnings), the run folders and the configuration."""
    lines = [f"# Run {report.run_id}: {report.status}", "", report.message, ""]
    lines += [f"> **Warning.** {alert}\n" for alert in report.alerts]
    for of in stages.STAGES:
        section = report.sections.get(of.name)
        if section is not None:
            lines += [f"## {of.name.capitalize()}", "", section.summary, ""] + [f"- warning: {w}" for w in section.warnings]
            lines += [""] if section.warnings else []
        elif of.name in OWN_SECTIONS:
            lines += OWN_SECTIONS[of.name](report)
    lines += ["## Run folders", "", report.run_folders, ""] if report.run_folders else []
    if report.config is not None:
        lines += ["## Configuration", "", f"What the run was asked to do, resolved: [`config.json`]({report.config_json}) "
                  "(`stoke run ... --config` it to run the same elsewhere).", "",
                  "<details><summary>Run configuration</summary>", "", "```json",
                  json.dumps(report.config, indent=2), "```", "", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def _ingest_section(report: RunReport) -> list[str]:
    i = report.ingest
    if i is None:
        return []
    if not i.published:
        return ["## Ingest", "", i.message or i.error or "nothing published", ""]
    lines = ["## Ingest", "", "| span | train | eval | dead letters | new files | images/s |",
             "| --- | --- | --- | --- | --- | --- |",
             f"| {i.span} | {i.counts.train} | {i.counts.eval} | {i.counts.dead_letter} | {i.new_sources} | "
             f"{figure(i.images_per_sec)} |", ""]
    if i.dead_letters:
        lines += [f"Dead letters (all in `{i.dead_letter_uri}`):", ""]
        lines += [f"- `{d.uri}`: {d.reason}" for d in i.dead_letters] + [""]
    return lines


def _datacheck_section(report: RunReport) -> list[str]:
    return data_section.section(report.datacheck, report.ingest, RunDir(report.run_dir).root, report.plots,
                                     report.unserved_spans)


def _train_section(report: RunReport) -> list[str]:
    return _training_lines(report.train, report.plots) if report.train is not None else []


def _gate_section(report: RunReport) -> list[str]:
    v = report.gate
    if v is None:
        return []
    lines = ["## Gate", "", f"**{'Blessed' if v.blessed else 'Not blessed'}**"
             + (f" against served version {v.baseline_version}" if v.baseline_version else
                " (no served version to compare with)"), ""]
    lines += [f"- {reason}" for reason in v.reasons]
    lines += [f"- note: {note}" for note in v.notes] + [""]
    if v.comparison is not None:
        lines += comparison_in_words(v.comparison, v.thresholds.max_regression)
        if report.plots.get("comparison"):
            lines += [f"![paired difference]({os.path.basename(report.plots['comparison'])})", ""]
    lines += _metrics_table(v.metrics, len(v.labels))
    lines += _per_class_table(v.metrics, v.comparison)
    if report.plots.get("confusion_matrix"):
        lines += [f"![confusion matrix]({os.path.basename(report.plots['confusion_matrix'])})", ""]
    return lines


def _push_section(report: RunReport) -> list[str]:
    p = report.push
    if p is None:
        return []
    lines = ["## Push", "", f"Version **{p.version}** of `{p.model_uri}`; serving image build context `{p.serving_uri}`"
             + ("; image built." if p.image and p.image.built else
                f"; image not built ({p.image.reason or 'no container engine'})." if p.image else "."), ""]
    lines += [f"Model card: [`{p.model_card}`]({p.model_card})", ""] if p.model_card else []
    lines += [f"Set aside `{a.name}` as `{a.moved_to}`: {a.reason}." for a in p.set_aside or []]
    lines += [""] if p.set_aside else []
    if p.commands:
        lines += ["```sh"] + [f"# {name}\n{cmd}" for name, cmd in p.commands.to_json().items()] + ["```", ""]
    return lines


# The stages with a section of their own in report.md; every other stage gets the generic one.
OWN_SECTIONS = {"ingest": _ingest_section, "datacheck": _datacheck_section, "train": _train_section,
                "gate": _gate_section, "push": _push_section}


# ---------------------------------------------------------------- pieces


def _training_lines(t, plots: dict) -> list[str]:
    """The report's Training section."""
    lines = ["## Training", "",
             "| network | spans | epochs | steps | strategy | precision | images/s | eval accuracy | eval loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             f"| {t.network} | {t.spans} | {t.epochs} | {t.total_steps} | {t.strategy} "
             f"x{t.replicas} | {t.precision} | {figure(t.images_per_sec)} | "
             f"{figure(t.eval.accuracy, 4)} | {figure(t.eval.loss, 4)} |",
             ""]
    lines += [_network_in_words(t), ""] if t.network_digest else []
    lines += [_start_in_words(t.start), ""] if t.start else []
    lines += [_phases_in_words(t), ""] if t.phases and t.phases[0].name != "all" else []
    lines += [f"Environment: {t.environment.in_words() if t.environment else 'not recorded'}.", ""]
    lines += [f"Input: {t.verdict}", ""]
    lines += [f"Shards: {t.shards}", ""] if t.shards else []
    if t.data_service:
        service = t.data_service
        lines += [f"Input pipeline on the tf.data service at `{service.address}` ({service.processing_mode}): "
                  f"{service.workers} workers when training started, {figure(service.workers_at_end)} at its end.", ""]
    if t.profiler:
        lines += [f"Profiler (input-pipeline analyzer on {t.profiler.steps} traced steps, TensorBoard's "
                  f"Profile tab): {t.profiler.conclusion}", ""]
        if t.input_bound is False and t.profiler.classification in ("highly", "moderately", "potentially"):
            # The two answer different questions, and on a CPU input and model share the cores.
            lines += ["The probe and the profiler measure different things: the probe compares how fast the input "
                      "pipeline alone delivers with how fast the model alone takes batches (it can keep up); the "
                      f"profiler timed {t.profiler.steps} steps of training, where input and model ran together "
                      "on the same cores, and counts any wait for input, however short, as a possible bottleneck.",
                      ""]
    return lines + [f"![{name}]({os.path.basename(uri)})" for name, uri in plots.items()
                    if name in ("curves", "throughput", "gpus")] + [""]


def _network_in_words(t) -> str:
    """The network and the SHA-256 of its code, its identity (components/common/networks.py)."""
    kept = network_parts(t.network)[0] in ("module", "file")
    return (f"Network `{t.network}`, its code's SHA-256 `{t.network_digest}`"
            + (f"; the code it trained with is in `{CODE}/` beside this report." if kept else "."))


def _start_in_words(start) -> str:
    """Where the run started (components/train/warm.py), one line."""
    if start.kind == "warm":
        return (f"Warm start from version {start.from_version}: {start.new_records:,} new records + "
                f"{start.replay_records:,} replayed (spans {start.new_spans} new; a sample of {start.replay_spans}).")
    return f"Full retrain: {start.reason}."


def _phases_in_words(t) -> str:
    """A fine-tuned run's phases (components/train/recipe.py), one clause each."""
    said = {"head": "trained the new head alone, the backbone frozen", "fine_tune": "fine-tuned the backbone too"}
    clauses = [f"epochs {p.first_epoch}-{p.first_epoch + p.epochs - 1} {said[p.name]} ({p.steps:,} steps, "
               f"{p.trainable_parameters:,} trainable parameters, peak learning rate {p.peak_learning_rate:g})"
               for p in t.phases]
    return (f"Fine-tuned from `{t.weights}`: " + "; then ".join(clauses)
            + "; the backbone's batch normalization kept its loaded statistics (inference mode) throughout.")


def _pushed(push: PushSummary | None) -> bool:
    return bool(push and (push.pushed or push.already_pushed))


def _outcome(gate: GateResult | None, push: PushSummary | None, skipped, failed) -> tuple[str, str]:
    if failed:
        return "failed", f"The run failed: {failed}"
    if skipped:
        return "skipped", f"Nothing to do: {skipped}."
    if _pushed(push):
        return "pushed", f"Blessed and pushed as version {push.version}."
    if gate is not None and not gate.blessed:
        reasons = "; ".join(gate.reasons) or "no reason given"
        return "refused", f"The candidate was not blessed, so nothing was pushed: {reasons}."
    return "trained", "Trained; not gated or pushed."


def comparison_in_words(comparison: Comparison, max_regression: float) -> list[str]:
    """The paired difference with its interval, p-value and what the eval set can detect, as sentences."""
    lines = []
    for c, whom in ((comparison, f"served version {comparison.version}"),
                    (comparison.best_retained, "the most accurate retained version {}")):
        if c is None:
            continue
        (lower, upper), (b, c_) = c.interval, c.discordant
        if upper < -max_regression:
            verdict = "worse by more than the allowed regression, with evidence"
        elif c.difference < -max_regression:
            verdict = "a drop beyond the allowance, but within noise"
        else:
            verdict = "within the allowed regression"
        lines.append(f"Candidate minus {whom.format(c.version)} on {c.example_count} eval records: "
                     f"{c.difference:+.3f} ({comparison.confidence:.0%} interval {lower:+.3f} to {upper:+.3f}; "
                     f"McNemar's exact p = {c.p_value:.2g}; {b} records only the candidate got right, {c_} only the "
                     f"served version). Allowed regression {max_regression:g}: {verdict}.")
    rule = ("decided on the interval (gate.decision: evidence)" if comparison.decision == "evidence" else
            "decided on the point estimates (gate.decision: point)")
    lines.append(f"This eval set detects drops of about {comparison.detectable_difference:.3f} with 80% power; {rule}.")
    return [line for text in lines for line in (text, "")]


def _comparison_plot(comparison: Comparison, max_regression: float, uri: str) -> None:
    rows = [(f"vs version {c.version}", c.difference, *c.interval)
            for c in (comparison, comparison.best_retained) if c is not None]
    draw.differences(rows, max_regression, uri, title=f"{comparison.confidence:.0%} paired intervals")


def _metrics_table(metrics: GateMetrics, classes: int) -> list[str]:
    """The overall figures; top-k accuracy only when k is below the number of classes (else it is 1, and says nothing)."""
    trivial = {"top_k_accuracy"} if metrics.top_k >= classes else set()
    scalars = {k: v for k, v in metrics.to_json().items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k != "top_k" and k not in trivial}
    if not scalars:
        return []
    return ["| metric | value |", "| --- | --- |"] + [f"| {k} | {figure(v, 4)} |" for k, v in sorted(scalars.items())] + [""]


# The guard against forgetting's verdicts (components/gate/forgetting.py), as the table says them.
CLASS_VERDICTS = {"worse": "**worse**: a reason to refuse", "within noise": "fell, within noise", "held": "held"}


def _per_class_table(metrics: GateMetrics, comparison: Comparison | None) -> list[str]:
    """Accuracy per class and, when the gate compared class by class, a table against the served version with
    the figures of the guard against forgetting and its verdict, and one against the reference when it is
    another version."""
    accuracy, examples = metrics.per_class_accuracy, metrics.per_class_examples
    if not accuracy:
        return []
    tables = [t for t in (comparison.per_class, comparison.reference) if t is not None] if comparison else []
    if not tables:
        lines = ["| class | eval examples | accuracy |", "| --- | --- | --- |"]
        lines += [f"| {name} | {examples.get(name, '-')} | {figure(value, 4)} |" for name, value in sorted(accuracy.items())]
        return lines + [""]
    return [line for table in tables for line in _class_comparison(accuracy, examples, table)]


def _class_comparison(accuracy: dict[str, float], examples: dict[str, int],
                      table: PerClassComparison | ReferenceComparison) -> list[str]:
    """One table of the guard against forgetting: each class's figures, the other version's beside them."""
    rows = {row.label: row for row in table.classes}
    if isinstance(table, ReferenceComparison):
        whom, short, absent = (f"the reference, version {table.version} (pushed {table.pushed_at[:10]}, {table.days} "
                               f"days ago; {table.versions_since} versions pushed since), on the eval records both "
                               "answered", "reference", "not answered by the reference")
    else:
        whom, short, absent = f"served version {table.version}", "served", "new: not compared"
    lines = [f"Class by class against {whom}: McNemar's exact one-sided test on each class's records, Holm's "
             f"step-down over the {len(rows)} classes at {table.level:g}; a class is worse when its fall is "
             f"significant and beyond the allowed regression {table.max_regression:g}.", "",
             f"| class | eval examples | accuracy | {short} | only candidate right / only {short} right | p, one-sided "
             "| Holm threshold | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, value in sorted(accuracy.items()):
        row = rows.get(name)
        if row is None:
            lines.append(f"| {name} | {examples.get(name, '-')} | {figure(value, 4)} | - | - | - | - | {absent} |")
            continue
        n, (b, c) = row.example_count, row.discordant
        lines.append(f"| {name} | {n} | {figure(row.right / n, 4)} ({row.right}/{n}) | "
                     f"{figure(row.baseline_right / n, 4)} ({row.baseline_right}/{n}) | {b} / {c} | {row.p_value:.2g} "
                     f"| {row.threshold:.2g} | {CLASS_VERDICTS[row.verdict]} |")
    return lines + [""]


def _plots(run: RunDir, report: RunReport, train: TrainMetrics | None, gate: GateResult | None) -> dict:
    """Curves (the trainer's), GPU use while training, the confusion matrix (the gate's, drawn
    here only if it has none) and a throughput chart of the stages side by side."""
    plots = {}
    if exists(run.curves):
        plots["curves"] = run.curves
    if train is not None and draw.gpu_use(train.gpu, run.gpus_plot):
        plots["gpus"] = run.gpus_plot
    if gate is not None and exists(gate.confusion_matrix_uri):
        plots["confusion_matrix"] = gate.confusion_matrix_uri
    elif gate is not None and gate.metrics.confusion_matrix:
        plots["confusion_matrix"] = run.confusion_matrix
        draw.confusion_matrix(gate.metrics.confusion_matrix, gate.labels, run.confusion_matrix)
    if gate is not None and gate.comparison is not None:
        plots["comparison"] = run.comparison_plot
        _comparison_plot(gate.comparison, gate.thresholds.max_regression, run.comparison_plot)
    rates = _rates(report)
    if rates:
        plots["throughput"] = run.throughput_plot
        _plot_rates(rates, plots["throughput"])
    return plots


def _rates(report: RunReport) -> dict:
    ingest, train = report.ingest, report.train
    rates = {"ingest (Beam)": ingest.images_per_sec if ingest and ingest.published else None}
    if train is not None:
        rates.update({"training steps": train.images_per_sec, "input pipeline alone": train.input_images_per_sec,
                      "model on one batch": train.model_images_per_sec})
    return {name: value for name, value in rates.items() if value}


def _plot_rates(rates: dict, uri: str) -> None:
    fig, ax = draw.pyplot().subplots(figsize=(7, 0.6 * len(rates) + 1.2))
    ax.barh(list(rates), list(rates.values()), color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("images per second")
    for y, value in enumerate(rates.values()):
        ax.text(value, y, f" {value:,.0f}", va="center")
    draw.save(fig, uri)


def _unserved(run: RunDir, config: dict | None) -> list[str]:
    """The published spans the newest served version was not trained on (by number and manifest), each with
    its data-check status (none when no version is served: then no span is)."""
    from components.common.repository import Repository

    root = Root(run.root)
    try:
        repository = Repository(root.uri, (config or {}).get("model_name", "stoke"))
        version = repository.newest()
        lineage = repository.lineage(version) if version is not None else None
        if lineage is None:
            return []
        spans, seen = Spans(root), lineage.trained_on()
        digests = {n: spans.manifest_sha256(n) for n in spans.published()}
        records = {n: spans.check_record(n, digest).record for n, digest in digests.items() if (n, digest) not in seen}
        return [f"{n} ({record.status if record else 'unchecked'})" for n, record in records.items()]
    except (OSError, ValueError):
        return []


def _run_folders(run: RunDir, alerts: list[str]) -> str | None:
    """What the retention rule did as the run ended, in words; a prune that failed is also an alert."""
    try:
        summary = read_result(run.retention, RetentionSummary) if exists(run.retention) else None
    except (OSError, ValueError):
        summary = None  # a record of the prune, not of the run: the report stands without it
    if summary is not None and summary.error:
        alerts.append(summary.in_words())
    return summary.in_words() if summary is not None else None


def _train_records(run: RunDir, train: TrainMetrics | None) -> int | None:
    """The training records of the spans the run trained on, as their manifests count them."""
    if train is None:
        return None
    try:
        return sum(m.counts.train for m in Spans(run.root).each_manifest(train.spans, checked=False, sources=False))
    except (OSError, ValueError):
        return None
