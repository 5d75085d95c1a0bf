"""The report's Data check section: what the data check found in the new span, what ingest kept out, and
what was held back with the command that lets it in."""
from __future__ import annotations

import os

from components.common import plots as draw
from components.contracts.layout import RunDir
from components.contracts.summaries import DataCheckSummary, IngestSummary


def plot(run: RunDir, data: DataCheckSummary | None) -> dict:
    """The span's label mix beside the history's, when both are known."""
    if data is None or not data.label_counts:
        return {}
    history = ", ".join(map(str, data.history_spans or []))
    draw.label_shares(data.label_counts, data.history_label_counts or {}, run.labels_plot,
                      title=f"span {data.span} against spans {history}" if history else
                      f"span {data.span}, the first (no history to compare with)")
    return {"labels": run.labels_plot}


def section(data: DataCheckSummary | None, ingest: IngestSummary | None, root: str, plots: dict) -> list[str]:
    if data is None and not (ingest and ingest.published):
        return []
    lines = ["## Data check", ""]
    if data is not None and data.checked:
        history = ", ".join(map(str, data.history_spans)) if data.history_spans else "none (the first span)"
        drift = f"; label drift {data.label_drift:.3f} (L-infinity)" if data.label_drift is not None else ""
        lines += [f"Span {data.span} against the published history (spans {history}): **{data.status}**{drift}.", ""]
        if data.status == "quarantined":
            lines += [f"**Held back**: span {data.span} is quarantined and this run trained without it. After a "
                      f"look at the examples below, let it in with `stoke spans release {data.span} --root {root}`.",
                      ""]
        lines += anomalies(data) + labels(data, plots)
    elif data is not None:
        lines += [data.message or data.error or "not checked", ""]
    return lines + kept_out(ingest)


def anomalies(data: DataCheckSummary) -> list[str]:
    if not data.anomalies:
        return ["No anomalies.", ""]
    lines = ["| severity | anomaly | records | what | examples |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a.severity} | {a.kind} | {a.count if a.count is not None else '-'} | {a.message} | "
              f"{', '.join(f'`{uri}`' for uri in a.examples) or '-'} |" for a in data.anomalies]
    return lines + [""]


def labels(data: DataCheckSummary, plots: dict) -> list[str]:
    mine, theirs = data.label_counts or {}, data.history_label_counts or {}
    if not mine:
        return []
    total, past = sum(mine.values()) or 1, sum(theirs.values()) or 1
    lines = [f"| class | span {data.span} | share | history | share |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {name} | {mine.get(name, 0)} | {mine.get(name, 0) / total:.0%} | {theirs.get(name, 0)} | "
              f"{theirs.get(name, 0) / past:.0%} |" for name in sorted(set(mine) | set(theirs))]
    if plots.get("labels"):
        lines += ["", f"![label mix]({os.path.basename(plots['labels'])})"]
    return lines + [""]


def kept_out(ingest: IngestSummary | None) -> list[str]:
    """Exact copies, near-duplicates and blank frames, as the ingest summary tells them."""
    if ingest is None or not ingest.published:
        return []
    listed = ingest.dead_letters or []
    blanks = sum(d.reason.startswith("blank image") for d in listed)
    more = ingest.counts is not None and ingest.counts.dead_letter > len(listed)
    lines = [f"Exact copies kept out at ingest: {ingest.duplicates or 0}. Blank frames set aside: {blanks}"
             + (f" among the first {len(listed)} dead letters" if more else "") + "."]
    near = ingest.near_duplicates
    if near and near.count:
        pair = near.examples[0]
        lines.append(f"Near-duplicates across splits (reported, not dropped): {near.count}, e.g. `{pair.uri}` "
                     f"({pair.split}) and `{pair.other_uri}` ({pair.other_split}), {pair.distance} bits apart.")
    return lines + [""]
