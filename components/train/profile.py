"""What TensorBoard's Profile tab says about the traced steps, read without TensorBoard.

The trainer traces a few steps (`trace_steps`, `--trace-steps`) into `tensorboard/plugins/profile/<session>/
<host>.xplane.pb`. The profile plugin (xprof) turns that XSpace into the input-pipeline analyzer's
page with its own converter, the one TensorBoard calls: a table of step times split into input,
compute and the rest, and a conclusion such as "Your program is HIGHLY input-bound because 62.1%
of the total step time sampled is waiting for input". That share is measured inside the traced
steps, so it is an independent check of Stoke's probe, which times the input pipeline and the
model apart after training.
"""
from __future__ import annotations

import json
import re
import sys

from components.common.files import filesystem, uri_of
from components.contracts.results import ProfilerVerdict

TOOL = "input_pipeline_analyzer"
# xprof's classes: HIGHLY (>= 20% of step time waiting for input), MODERATELY, COULD, POTENTIALLY, NOT.
CONCLUSION = re.compile(r"Your program (?:is |COULD be )?(\w+)")


def input_pipeline_verdict(tensorboard_dir: str) -> ProfilerVerdict | None:
    """The analyzer's summary of the newest trace under `tensorboard_dir`; None without one.

    A trace the plugin cannot read costs the run nothing but this summary: the reason goes to stderr."""
    fs, path = filesystem(tensorboard_dir)
    traces = sorted(uri_of(fs, t) for t in fs.glob(f"{path}/plugins/profile/*/*.xplane.pb"))
    if not traces:
        return None
    session = traces[-1].rsplit("/", 1)[0]
    hosts = [t for t in traces if t.startswith(session + "/")]
    try:
        from xprof.convert import raw_to_tool_data

        data, _ = raw_to_tool_data.xspace_to_tool_data(hosts, TOOL, {})
        return parse(data, session)
    except Exception as error:  # the plugin's converter raises whatever its C++ side reports
        print(f"stoke train: the profile plugin could not read {session}: {error}", file=sys.stderr, flush=True)
        return None


def parse(data: bytes | str | None, session: str) -> ProfilerVerdict | None:
    """The summary table of the analyzer's JSON (the page's DataTables, the step table second)."""
    if not data:
        return None
    tables = json.loads(data)
    steps = next((t for t in tables if any(c.get("id") == "stepTimeMs" for c in t.get("cols", []))), None)
    if steps is None:
        return None
    summary, columns = steps.get("p", {}), [c.get("id") for c in steps["cols"]]
    rows = [[cell.get("v") for cell in row["c"]] for row in steps.get("rows", [])]
    # The share the analyzer's conclusion states when it is about input: input time over step time, summed.
    step_time = sum(row[columns.index("stepTimeMs")] for row in rows)
    input_time = sum(row[columns.index("infeedTimeMs")] for row in rows)
    conclusion = summary.get("input_conclusion", "")
    verdict = CONCLUSION.match(conclusion)
    return ProfilerVerdict(
        input_percent=round(100 * input_time / step_time, 2) if step_time else None,
        classification=verdict.group(1).lower() if verdict else "unknown",
        input_bound=bool(verdict) and verdict.group(1) == "HIGHLY",
        step_time_ms=_float(summary.get("steptime_ms_average")),
        input_time_ms=_float(summary.get("infeed_time_ms_avg")),
        steps=len(rows),
        conclusion=conclusion,
        trace=session,
    )


def _float(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
