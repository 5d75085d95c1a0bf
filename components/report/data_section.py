"""The report's Data check section: what the data check found in the new span (its suspected label errors
file by file), what ingest kept out, and what was held back with the command that lets it in."""
from __future__ import annotations

import os

from components.common import plots as draw
from components.common.files import exists, read_bytes, write_whole
from components.contracts.layout import RunDir
from components.contracts.summaries import DataCheckSummary, IngestSummary, SpanCheck, release_command

LISTED = 50  # suspected label errors listed file by file; the record holds them all


def plot(run: RunDir, data: DataCheckSummary | None) -> dict:
    """The newest checked span's label mix beside the history's, when both are known, and a copy of the
    sheet of its suspected label errors that the data check drew beside the span's record."""
    check = data.spans[-1] if data is not None and data.spans else None
    if check is None:
        return {}
    found = {}
    sheet = check.label_check.sheet if check.label_check else None
    if sheet and exists(sheet):  # beside report.md, where its link and Prefect's inlining find it
        write_whole(run.label_errors_plot, read_bytes(sheet))
        found["label_errors"] = run.label_errors_plot
    if not check.label_counts:
        return found
    history = ", ".join(map(str, check.history_spans))
    draw.label_shares(check.label_counts, check.history_label_counts or {}, run.labels_plot,
                      title=f"span {check.span} against spans {history}" if history else
                      f"span {check.span}, the first (no history to compare with)")
    return {**found, "labels": run.labels_plot}


def section(data: DataCheckSummary | None, ingest: IngestSummary | None, root: str, plots: dict,
            unserved: list[str] = ()) -> list[str]:
    """The Data check section; `unserved` names the published spans the served model was not trained on."""
    if data is None and not (ingest and ingest.published) and not unserved:
        return []
    lines = ["## Data check", ""]
    for check in data.spans if data is not None else []:
        drift = f"; label drift {check.label_drift:.3f} (L-infinity)" if check.label_drift is not None else ""
        against = (f"against the spans the check let in ({', '.join(map(str, check.history_spans))})"
                   if check.history_spans else "with no history to compare with (the first span the check lets in)")
        lines += [f"Span {check.span}, {against}: **{check.status}**{drift}.", ""]
        if check.status == "quarantined":
            lines += [f"**Held back**: span {check.span} is quarantined and this run trained without it. After a "
                      f"look at the examples below, let it in with `{release_command(check.span, root)}`.",
                      ""]
        elif check.status == "warning":
            lines += [f"Let in with its warnings: span {check.span} is trained on (a warning, such as a change of "
                      "class mix, never holds a span back).", ""]
        newest = plots if check is data.spans[-1] else {}
        lines += anomalies(check) + label_errors(check, newest) + labels(check, newest)
    if data is not None and not data.spans:
        lines += [data.message or data.error or "nothing checked", ""]
    if unserved:
        lines += [f"Published spans the served model was not trained on: {', '.join(unserved)}.", ""]
    return lines + kept_out(ingest)


def anomalies(check: SpanCheck) -> list[str]:
    """The findings about the span as a whole (those about one file each are listed by label_errors)."""
    found = [a for a in check.anomalies if a.file is None]
    if not found:
        return ["No anomalies.", ""]
    lines = ["| severity | anomaly | records | what | examples |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a.severity} | {a.kind}{f': {a.issue}' if a.issue else ''} | {'-' if a.count is None else a.count} | "
              f"{a.message} | "
              f"{', '.join(f'`{uri}`' for uri in a.examples) or '-'} |" for a in found]
    return lines + [""]


def label_errors(check: SpanCheck, plots: dict) -> list[str]:
    """The label check: skipped and why, or what it judged, the flagged files per class pair and one by one."""
    done = check.label_check
    if done is None:
        return []
    if done.status == "skipped":
        return [f"Label check skipped: {done.reason}.", ""]
    lines = [f"Label check by the served model `{done.model}`: {done.checked} records judged"
             + (f" ({done.unknown} of classes it does not know, or that it could not read, left out)" if done.unknown else "")
             + f", {done.flagged} suspected label errors; a clean span would show about {done.expected_rate:.1%} "
             f"({done.expected_from})" + (f", exact binomial test p = {done.p_value:.2g}" if done.p_value is not None else "")
             + ".", ""]
    files = [a for a in check.anomalies if a.kind == "label_error" and a.file is not None]
    if not files:
        return lines
    lines += ["| given label | served model says | records |", "| --- | --- | --- |"]
    lines += [f"| {pair.given} | {pair.predicted} | {pair.count} |" for pair in done.pairs] + [""]
    if plots.get("label_errors"):
        lines += [f"![suspected label errors]({os.path.basename(plots['label_errors'])})", ""]
    lines += ["| file | split | given label | served model says | confidence |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{a.file}` | {a.label.split} | {a.label.given} | {a.label.predicted} | {a.label.confidence:.0%} |"
              for a in files[:LISTED]]
    if len(files) > LISTED:
        lines += ["", f"... and {len(files) - LISTED} more in `{check.record_uri}`."]
    return lines + [""]


def labels(check: SpanCheck, plots: dict) -> list[str]:
    mine, theirs = check.label_counts or {}, check.history_label_counts or {}
    if not mine:
        return []
    total, past = sum(mine.values()) or 1, sum(theirs.values()) or 1
    if theirs:
        lines = [f"| class | span {check.span} | share | history | share |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {name} | {mine.get(name, 0)} | {mine.get(name, 0) / total:.0%} | {theirs.get(name, 0)} | "
                  f"{theirs.get(name, 0) / past:.0%} |" for name in sorted(set(mine) | set(theirs))]
    else:
        lines = [f"| class | span {check.span} | share |", "| --- | --- | --- |"]
        lines += [f"| {name} | {count} | {count / total:.0%} |" for name, count in sorted(mine.items())]
    if plots.get("labels"):
        lines += ["", f"![label mix]({os.path.basename(plots['labels'])})"]
    return lines + [""]


def kept_out(ingest: IngestSummary | None) -> list[str]:
    """Exact copies, near-copies and images set aside for their quality (by folder: a dead camera's), as the
    ingest summary tells them."""
    if ingest is None or not (ingest.published or ingest.set_aside):
        return []
    aside = ingest.set_aside or {}
    lines = [f"Exact copies kept out at ingest: {ingest.duplicates or 0}. Images set aside for their quality "
             f"(blank, or an issue ingest.quality_set_aside names): {sum(aside.values())}"
             + (" (" + ", ".join(f"{count} in `{folder}`" for folder, count in aside.items()) + ")" if aside else "")
             + "."]
    near = ingest.near_duplicates
    if near and near.count:
        pair = near.examples[0]
        lines.append(f"Near-copies of another image (re-encoded, resized, cropped or mirrored): {near.count}; "
                     f"{near.moved} joined their original's split, {near.set_aside} set aside, {near.across} left in "
                     f"the other split; e.g. `{pair.uri}` ({pair.split}) and `{pair.other_uri}` ({pair.other_split}), "
                     f"{pair.distance} bits apart{' as mirror images' if pair.mirrored else ''}.")
    if near and near.crowded:
        lines.append(f"Images among pictures alike at dHash's 9x8 (a fixed camera, scans, products on white): "
                     f"{near.crowded}; judged by their block colours, the distinct ones kept their own split.")
    return lines + [""]
