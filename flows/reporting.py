"""What a run shows in Prefect: its report and the pushed version's model card as markdown artifacts, and a
progress artifact per long stage."""
from __future__ import annotations

import base64
import logging
import re
import sys

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from components.common.files import filesystem
from components.common.program import ProgressBar
from components.contracts import summaries
from components.contracts.layout import RunDir
from flows.console import console_of_logs


def publish_report(run: RunDir, skipped: str | None = None, failed: str | None = None) -> dict:
    """Writes the run's report into its folder (components/report) and shows it as an artifact; returns its summary."""
    from components.report.report import write_report

    report = write_report(run, skipped=skipped, failed=failed)
    create_markdown_artifact(with_inline_plots(report["markdown"], report["summary"]["plots"]),
                             key=artifact_key("report", run), description=f"run report: {report['report_md']}")
    card = (report["summary"].get("push") or {}).get("model_card")
    if card:
        fs, path = filesystem(card)
        if fs.exists(path):
            create_markdown_artifact(fs.cat_file(path).decode(), key=artifact_key("model-card", run),
                                     description=f"model card: {card}")
    return report["summary"]


def prune_runs(run: RunDir) -> None:
    """Applies the retention rule to ROOT/runs as the run ends, before its report, which says what it did;
    a prune that fails is a warning in the log and the report, never the run's failure."""
    from components.common.run_retention import after_run

    summary = after_run(run)
    get_run_logger().log(logging.WARNING if summary.error else logging.INFO, "%s", summary.in_words())


def with_inline_plots(markdown: str, plots: dict) -> str:
    """The report with its PNGs inlined: the Prefect UI cannot read files from ROOT."""
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


class ProgressArtifact:
    """A Prefect progress artifact moved along by a stage program's progress events, and, when stdout is a
    terminal, a bar on it below the run's log lines (the log itself keeps no progress line)."""

    def __init__(self, stage: str):
        self.stage, self.artifact, self.bar = stage, None, None

    def __enter__(self):
        self.artifact = create_progress_artifact(0.0, description=f"{self.stage} progress")
        self.bar = ProgressBar(console_of_logs()) if sys.stdout.isatty() else None
        return self

    def __call__(self, event: summaries.Progress) -> None:
        if event.fraction is not None:
            update_progress_artifact(self.artifact, min(100.0 * event.fraction, 99.0))
        if self.bar is not None:
            self.bar(event)

    def __exit__(self, kind, *rest):
        if self.bar is not None:
            self.bar.close(finished=kind is None)
        if kind is None:
            update_progress_artifact(self.artifact, 100.0)
