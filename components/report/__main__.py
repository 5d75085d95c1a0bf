"""`python -m components.report --root ROOT --run-id ID`: (re)builds a run's report from its folder."""
import sys

from components.contracts import program
from components.contracts.layout import Root
from components.report.report import write_report


def run(argv: list[str] | None = None) -> int:
    parser = program.arguments("stoke report", __doc__)
    parser.add_argument("--root", required=True, help="artifact ROOT: local path or fsspec URI")
    parser.add_argument("--run-id", required=True, help="run folder under ROOT/runs")
    args = parser.parse_args(argv)
    return program.main("stoke report", args.json,
                        lambda: write_report(Root(args.root).run(args.run_id))["summary"],
                        lambda summary: f"{summary['status']}: {summary['message']}\nreport: {summary['report_md']}",
                        errors=(ValueError, OSError))


sys.exit(run())
