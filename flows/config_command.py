"""`stoke config show [SOURCE] [--root ROOT] [--config FILE] [--set ...] [--preset P]`: the run
configuration those options describe, resolved as a run would resolve it, printed as YAML with every
setting's help above it (a file `--config` takes), or as JSON with --json."""
from __future__ import annotations

import argparse
import json
import sys

from components.common import config_files
from components.common.program import BAD_SETTINGS, printable
from components.contracts.secrets import recorded
from flows.run_options import add_config_arguments, as_yaml, config_from

PLACEHOLDERS = {"source": "SOURCE", "root": "ROOT"}  # shown for what the options leave out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["show"], help="show: print the resolved run configuration")
    add_config_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print it as one JSON object instead")


def show(args: argparse.Namespace) -> int:
    try:
        config = config_from(args, **{name: value for name, value in PLACEHOLDERS.items() if not _given(args, name)})
    except config_files.ConfigError as error:
        print(f"stoke config: error: {printable(str(error))}", file=sys.stderr, flush=True)
        return BAD_SETTINGS
    resolved = config.resolved()
    resolved = resolved.model_copy(update={"source": recorded(resolved.source)})  # printed: never its credentials
    print(json.dumps(resolved.model_dump(mode="json"), sort_keys=True) if args.json else as_yaml(resolved), end="\n"
          if args.json else "", flush=True)
    return 0


def _given(args: argparse.Namespace, name: str) -> bool:
    """Whether SOURCE or ROOT is given, on the command line or in the file."""
    return getattr(args, name) is not None or (bool(args.config) and name in config_files.read_file(args.config))
