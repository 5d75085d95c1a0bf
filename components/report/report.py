"""The run report: what one run did, built from its run folder alone.

Reads ROOT/runs/<run-id>/summaries/<stage>.json (each stage's JSON summary, as its program printed
it) and writes report.json, report.md and the confusion-matrix plot next to them; the training
curves (curves.png) are the trainer's. The orchestrator shows the same markdown; nothing here knows
about it, so `write_report` can rebuild the report of any run, also one that failed halfway.
"""
from __future__ import annotations

import os

from components.common import plots as draw
from components.common.files import exists, read_json, write_json, write_text
from components.contracts.layout import RunDir
from components.contracts.program import printable
from components.contracts.results import InputProbe, Result, TrainMetrics, Validation

STAGES = ("preflight", "ingest", "train", "validate", "push")


def build_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> dict:
    """The report as a JSON-able dict: one section per stage that left a summary."""
    preflight, ingest, push = (_read(run.summary(stage)) for stage in ("preflight", "ingest", "push"))
    train = _read(run.summary("train"), TrainMetrics)
    validation = _read(run.summary("validate"), Validation)
    present = dict(zip(STAGES, (preflight, ingest, train, validation, push)))
    report = {"run_id": run.run_id, "run_dir": run.uri, "stages": [s for s, v in present.items() if v is not None]}
    report["status"], report["message"] = _outcome(validation, push, skipped, failed)
    # The headline, with the same keys as `stoke run --json`: blessed, pushed_version, reasons, metrics.
    pushed = bool(push and (push.get("pushed") or push.get("already_pushed")))
    report.update(
        blessed=bool(validation and validation.blessed),
        pushed_version=push.get("version") if pushed else None,
        reasons=validation.reasons if validation else [],
        metrics=validation.metrics.model_dump(include={"accuracy", "top_k_accuracy", "example_count",
                                                       "majority_class_rate"}) if validation else {},
        model_uri=push.get("model_uri") if pushed else None,
    )
    if preflight is not None:
        report["preflight"] = {"status": preflight.get("status"), "failed": preflight.get("failed", []),
                               "warnings": [f"{c['name']}: {c['summary']}" for c in preflight.get("checks", [])
                                            if c.get("status") == "warn"]}
    if ingest is not None:
        report["ingest"] = {key: ingest.get(key) for key in (
            "published", "span", "span_uri", "counts", "new_sources", "images_per_sec", "seconds",
            "dead_letters", "dead_letter_uri", "message", "error") if ingest.get(key) is not None}
    if train is not None:
        probe = train.input
        report["train"] = {
            **train.model_dump(mode="json", include={
                "model", "spans", "epochs", "total_steps", "strategy", "precision", "xla", "replicas",
                "global_batch_size", "images_per_sec", "train", "eval", "model_dir", "resumed_from_step"}),
            "input_bound": probe.input_bound,
            "input_images_per_sec": probe.input_images_per_sec,
            "model_images_per_sec": probe.model_images_per_sec_synthetic,
            "input_wait_seconds": probe.input_wait_seconds,
            "verdict": _verdict(probe, train.image_size),
            "profiler": train.profiler.model_dump(mode="json") if train.profiler else None,
        }
    if validation is not None:
        report["validation"] = validation.model_dump(mode="json", include={
            "blessed", "reasons", "notes", "metrics", "labels", "thresholds", "baseline_version", "validation_uri"})
    if push is not None:
        report["push"] = {key: push.get(key) for key in (
            "pushed", "already_pushed", "version", "previous_version", "model_uri", "serving_uri",
            "commands", "image", "retired", "message")}
    report["plots"] = _plots(run, report, train, validation)
    return report


def write_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> dict:
    """Builds the report and writes report.json, report.md and plots into the run folder.

    Returns {"summary": the report dict, "markdown": report.md's text, "report_md": its URI}."""
    report = build_report(run, skipped, failed)
    report["report_md"], report["report_json"] = run.report_md, run.report_json
    markdown = render_markdown(printable(report))  # names in the markdown cannot carry escapes
    write_text(run.report_md, markdown)
    write_json(run.report_json, report)
    return {"summary": report, "markdown": markdown, "report_md": report["report_md"]}


def render_markdown(report: dict) -> str:
    lines = [f"# Run {report['run_id']}: {report['status']}", "", report["message"], ""]
    if "preflight" in report:
        p = report["preflight"]
        lines += ["## Preflight", "", f"Status: **{p['status']}**"
                  + (f"; failed: {', '.join(p['failed'])}" if p["failed"] else ""), ""]
        lines += [f"- warning: {w}" for w in p["warnings"]] + ([""] if p["warnings"] else [])
    if "ingest" in report:
        i = report["ingest"]
        lines += ["## Ingest", ""]
        if i.get("published"):
            counts = i.get("counts") or {}
            lines += ["| span | train | eval | dead letters | new files | images/s |",
                      "| --- | --- | --- | --- | --- | --- |",
                      f"| {i.get('span')} | {counts.get('train')} | {counts.get('eval')} | "
                      f"{counts.get('dead_letter')} | {i.get('new_sources')} | {_num(i.get('images_per_sec'))} |", ""]
            if i.get("dead_letters"):
                lines += [f"Dead letters (all in `{i.get('dead_letter_uri')}`):", ""]
                lines += [f"- `{d['uri']}`: {d['reason']}" for d in i["dead_letters"]] + [""]
        else:
            lines += [i.get("message") or i.get("error") or "nothing published", ""]
    if "train" in report:
        t = report["train"]
        lines += ["## Training", "",
                  "| model | spans | epochs | steps | strategy | precision | images/s | eval accuracy | eval loss |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
                  f"| {t['model']} | {t['spans']} | {t['epochs']} | {t['total_steps']} | {t['strategy']} "
                  f"x{t['replicas']} | {t['precision']} | {_num(t['images_per_sec'])} | "
                  f"{_num((t.get('eval') or {}).get('accuracy'), 4)} | {_num((t.get('eval') or {}).get('loss'), 4)} |",
                  "", f"Input: {t['verdict']}", ""]
        if t.get("profiler"):
            lines += [f"Profiler (input-pipeline analyzer on {t['profiler']['steps']} traced steps, TensorBoard's "
                      f"Profile tab): {t['profiler']['conclusion']}", ""]
        lines += [f"![{name}]({os.path.basename(uri)})" for name, uri in report["plots"].items()
                  if name in ("curves", "throughput", "gpus")] + [""]
    if "validation" in report:
        v = report["validation"]
        lines += ["## Validation", "", f"**{'Blessed' if v['blessed'] else 'Not blessed'}**"
                  + (f" against served version {v['baseline_version']}" if v.get("baseline_version") else
                     " (no served version to compare with)"), ""]
        lines += [f"- {reason}" for reason in v.get("reasons") or []]
        lines += [f"- note: {note}" for note in v.get("notes") or []] + [""]
        lines += _metrics_table(v.get("metrics") or {})
        lines += _per_class_table(v.get("metrics") or {})
        if report["plots"].get("confusion_matrix"):
            lines += [f"![confusion matrix]({os.path.basename(report['plots']['confusion_matrix'])})", ""]
    if "push" in report:
        p = report["push"]
        image = p.get("image") or {}
        lines += ["## Push", "", f"Version **{p.get('version')}** of `{p.get('model_uri')}`"
                  f"; serving image build context `{p.get('serving_uri')}`"
                  + ("; image built." if image.get("built") else
                     f"; image not built ({image.get('reason', 'no container engine')})." if image else "."), ""]
        commands = p.get("commands") or {}
        if commands:
            lines += ["```sh"] + [f"# {name}\n{cmd}" for name, cmd in _command_items(commands)] + ["```", ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- pieces


def _outcome(validation: Validation | None, push: dict | None, skipped, failed) -> tuple[str, str]:
    if failed:
        return "failed", f"The run failed: {failed}"
    if skipped:
        return "skipped", f"Nothing to do: {skipped}."
    if push and (push.get("pushed") or push.get("already_pushed")):
        return "pushed", f"Blessed and pushed as version {push.get('version')}."
    if validation is not None and not validation.blessed:
        reasons = "; ".join(validation.reasons) or "no reason given"
        return "refused", f"The candidate was not blessed, so nothing was pushed: {reasons}."
    return "trained", "Trained; not validated or pushed."


def _verdict(probe: InputProbe, image_size: int | None = None) -> str:
    if probe.input_images_per_sec is None:
        return "not measured"
    rate, model = probe.input_images_per_sec, probe.model_images_per_sec_synthetic
    if model is None:
        return f"input pipeline alone: {_num(rate)} images/s"
    if probe.input_bound:
        text = (f"**input-bound**: the input pipeline delivers {_num(rate)} images/s, the model could take "
                f"{_num(model)}; the accelerator waited about {_num(probe.input_wait_seconds, 1)} s")
        fix = cheapest_fix(probe, image_size)
        return f"{text}. Cheapest fix: {fix}" if fix else text
    return f"not input-bound: input {_num(rate)} images/s against the model's {_num(model)} images/s"


def cheapest_fix(probe: InputProbe, image_size: int | None) -> str | None:
    """The cheapest change that makes the input faster, of those the probe's figures show: a training
    flag before a new ingest, and one ingest for every setting it should change."""
    if probe.cache is None and probe.decoded_gb is not None and probe.memory_gb \
            and probe.decoded_gb < probe.memory_gb / 4:
        return (f"train with `--cache memory`: the training split decoded is about {_num(probe.decoded_gb, 1)} GB, "
                f"and later epochs then skip reading and decoding")
    flags, reasons = [], []
    if image_size and probe.stored_short_side and probe.stored_short_side > 2 * image_size:
        flags.append(f"--max-side {max(512, 2 * image_size)}")
        reasons.append(f"the spans store images with a {probe.stored_short_side} px shorter side for "
                       f"{image_size} px training, and every epoch decodes them")
    if probe.compression in ("gzip", "zlib") and (probe.jpeg_share or 0) > 0.5:
        flags.append("--compression none")
        reasons.append(f"{probe.compression.upper()} saves under 1% on JPEG bytes and every epoch inflates them")
    if not flags:
        return None
    return f"ingest the source again into a new ROOT with `{' '.join(flags)}`: " + "; ".join(reasons)


def _metrics_table(metrics: dict) -> list[str]:
    scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k != "top_k"}
    if not scalars:
        return []
    return ["| metric | value |", "| --- | --- |"] + [f"| {k} | {_num(v, 4)} |" for k, v in sorted(scalars.items())] + [""]


def _per_class_table(metrics: dict) -> list[str]:
    accuracy, examples = metrics.get("per_class_accuracy") or {}, metrics.get("per_class_examples") or {}
    if not accuracy:
        return []
    lines = ["| class | eval examples | accuracy |", "| --- | --- | --- |"]
    lines += [f"| {name} | {examples.get(name, '-')} | {_num(value, 4)} |" for name, value in sorted(accuracy.items())]
    return lines + [""]


def _command_items(commands):
    if isinstance(commands, dict):
        return list(commands.items())
    return [(f"step {i}", c) for i, c in enumerate(commands, start=1)]


def _plots(run: RunDir, report: dict, train: TrainMetrics | None, validation: Validation | None) -> dict:
    """Curves (the trainer's), GPU use while training, the confusion matrix (validation's, drawn
    here only if it has none) and a throughput chart of the stages side by side."""
    plots = {}
    if exists(run.curves):
        plots["curves"] = run.curves
    if train is not None and draw.gpu_use(train.gpu, run.gpus_plot):
        plots["gpus"] = run.gpus_plot
    if validation is not None and exists(validation.confusion_matrix_uri):
        plots["confusion_matrix"] = validation.confusion_matrix_uri
    elif validation is not None and validation.metrics.confusion_matrix:
        plots["confusion_matrix"] = run.confusion_matrix
        draw.confusion_matrix(validation.metrics.confusion_matrix, validation.labels, run.confusion_matrix)
    rates = _rates(report)
    if rates:
        plots["throughput"] = run.throughput_plot
        _plot_rates(rates, plots["throughput"])
    return plots


def _rates(report: dict) -> dict:
    ingest, train = report.get("ingest") or {}, report.get("train") or {}
    rates = {"ingest (Beam)": ingest.get("images_per_sec") if ingest.get("published") else None,
             "training steps": train.get("images_per_sec"),
             "input pipeline alone": train.get("input_images_per_sec"),
             "model on one batch": train.get("model_images_per_sec")}
    return {name: value for name, value in rates.items() if value}


def _plot_rates(rates: dict, uri: str) -> None:
    fig, ax = draw.pyplot().subplots(figsize=(7, 0.6 * len(rates) + 1.2))
    ax.barh(list(rates), list(rates.values()), color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("images per second")
    for y, value in enumerate(rates.values()):
        ax.text(value, y, f" {value:,.0f}", va="center")
    draw.save(fig, uri)


def _read(uri: str, model: type[Result] | None = None):
    """A stage's summary: None when the stage did not run, typed when the stage's result has a model."""
    if not exists(uri):
        return None
    return model.read(uri) if model else read_json(uri)


def _num(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"
