"""`stoke runs --root ROOT`: the run folders under ROOT/runs and what the retention rule makes of them.

Newest first, each with its state, size, the rule's action and why (components/common/run_retention.py);
nothing is removed. `stoke runs prune --root ROOT [--keep K] [--keep-records N] [--dry-run]` applies the
rule. Each run applies it as it ends, with the `runs` settings of its configuration; by hand the options
give them (default: the settings' defaults), and --dry-run says what prune would remove.
"""
from __future__ import annotations

import sys

from components.common import program
from components.common.program import add_options, given
from components.common.run_retention import RetentionError, prune
from components.common.store_errors import naming
from components.contracts.config import RunsConfig
from components.contracts.layout import Root
from components.contracts.results import ResultError
from components.contracts.retention import RetentionSummary, RunFate


def run(argv: list[str] | None = None) -> int:
    parser = program.arguments("stoke runs", __doc__)
    parser.add_argument("action", nargs="?", choices=["prune"], help="prune: apply the rule (without it: only say "
                        "what it would do)")
    parser.add_argument("--root", required=True, help="artifact ROOT: local path or fsspec URI")
    parser.add_argument("--dry-run", action="store_true", help="say what prune would remove, and remove nothing")
    add_options(parser, RunsConfig)
    args = parser.parse_args(argv)
    dry_run = args.dry_run or args.action is None

    def work() -> RetentionSummary:
        settings = RunsConfig.model_validate(given({k: v for k, v in vars(args).items() if k in RunsConfig.model_fields}))
        with naming(args.root):
            return prune(Root(args.root), settings, dry_run=dry_run)

    return program.main("stoke runs", args.json, work, describe, errors=(RetentionError, ResultError, OSError))


def describe(summary: dict) -> str:
    found = RetentionSummary.model_validate(summary)
    width = max([len(fate.run_id) for fate in found.runs] + [3])
    rows = [f"{'run':<{width}}  {'state':<11}  {'size':>9}  {'action':<6}  why"]
    rows += [f"{fate.run_id:<{width}}  {fate.state:<11}  {_size(fate):>9}  {fate.action:<6}  {fate.why}"
             for fate in found.runs]
    return "\n".join(rows + [found.in_words()])


def _size(fate: RunFate) -> str:
    return f"{fate.bytes / 1e6:,.1f} MB"


if __name__ == "__main__":
    sys.exit(run())
