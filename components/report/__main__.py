"""`python -m components.report --root ROOT --run-id ID`: (re)builds a run's report from its folder."""
import sys

from components.common import program
from components.common.files import exists, read_result
from components.contracts.layout import Root, RunDir
from components.contracts.retention import Pruned
from components.report.report import write_report


def rebuild(run: RunDir) -> dict:
    """The report of a run folder that is there; a folder the retention rule removed, or is removing, has none."""
    if not exists(run.uri):
        raise ValueError(f"there is no run {run.run_id} under {Root(run.root).runs}: never run, or deleted by the "
                         f"retention rule (`stoke runs --root {run.root}` lists the runs)")
    if exists(run.pruned) and read_result(run.pruned, Pruned).kept == "nothing":
        raise ValueError(f"run {run.run_id} is being deleted by the retention rule (its pruned.json says so); "
                         f"`stoke runs prune --root {run.root}` finishes it")
    return write_report(run)["summary"]


def run(argv: list[str] | None = None) -> int:
    parser = program.arguments("stoke report", __doc__)
    parser.add_argument("--root", required=True, help="artifact ROOT: local path or fsspec URI")
    parser.add_argument("--run-id", required=True, help="run folder under ROOT/runs")
    args = parser.parse_args(argv)
    return program.main("stoke report", args.json, lambda: rebuild(Root(args.root).run(args.run_id)),
                        lambda summary: f"{summary['status']}: {summary['message']}\nreport: {summary['report_md']}",
                        errors=(ValueError, OSError))


sys.exit(run())
