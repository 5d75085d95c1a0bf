"""Hints that name settings are runnable as printed: each `--set GROUP.FIELD=VALUE` by `stoke run`, each
`stoke STAGE --flag VALUE` by the stage's program by hand (their own parsers, their own settings checks)."""
from __future__ import annotations

import json
import re
import shlex

from components.common import program
from components.contracts import stages


def commands(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """The `--set ...` overrides and the `stoke STAGE ...` commands a text shows, split as a shell would."""
    quoted = re.findall(r"`([^`]+)`", text)
    overrides = [shlex.split(q) for q in quoted if q.startswith("--set ")]
    by_hand = [shlex.split(q)[1:] for q in quoted if re.match(r"stoke (preflight|ingest|datacheck|train|gate|push) ", q)]
    return overrides, by_hand


def assert_runnable(text: str) -> None:
    """Every hint the text shows runs as shown; fails on a text that shows none."""
    from flows.cli import _parser
    from flows.run_options import config_from

    overrides, by_hand = commands(text)
    assert overrides or by_hand, text
    for argv in overrides:
        args = _parser().parse_args(["run", "photos", "--root", "root", *argv])
        config = config_from(args)
        for pair in args.overrides:
            path, value = pair.split("=", 1)
            group, field = path.split(".", 1)
            try:
                wanted = json.loads(value)  # as `--set` reads a value
            except json.JSONDecodeError:
                wanted = value
            assert getattr(getattr(config, group), field) == wanted, (pair, text)
    for stage, *argv in by_hand:
        needs = ["--root", "root"] + (["--source", "photos"] if "source" in stages.stage(stage).inputs else [])
        args = program.stage_parser(stage).parse_args([*argv, *needs])  # exits 2 on an unknown flag
        program.stage_config(stage, args)  # raises on a value the setting refuses
