"""The run configuration on the command line, the same for `stoke run`, `stoke up`, `stoke deploy`
and `stoke config show`: a file (`--config`), a few run-wide options, then `--set group.field=value`
overrides, in that order; `stoke config show` prints the result as a file `--config` takes."""
from __future__ import annotations

import argparse
import json

from pydantic import BaseModel

from components.common import config_files, network_code
from components.common.config_files import model_of
from components.contracts.config import check_network
from components.contracts.presets import PRESETS
from components.contracts.run_config import RunConfig, preset_problem

FIELDS = RunConfig.model_fields


def add_config_arguments(parser: argparse.ArgumentParser, source: str = "positional") -> None:
    """`--config`, `--set` and `--preset`, plus SOURCE (positional, or `--source`) and `--root`."""
    if source == "positional":
        parser.add_argument("source", nargs="?", default=None, help=FIELDS["source"].description)
    else:
        parser.add_argument("--source", default=None, help=FIELDS["source"].description)
    parser.add_argument("--root", default=None, help=FIELDS["root"].description)
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="run configuration, YAML or JSON (a run's ROOT/runs/<id>/config.json reruns it); "
                             "`stoke config show` prints every setting with its help")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="GROUP.FIELD=VALUE",
                        help="override one setting, e.g. --set train.epochs=3 (repeatable; the value is JSON where "
                             "it parses, else a string)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help=FIELDS["preset"].description)


POLL_SECONDS_MAX = 24 * 60 * 60  # watch-bucket lists SOURCE at least daily (the nightly run does anyway)


def bounded(kind: type, low: float, high: float):
    """An argparse type: a number of `kind` from `low` to `high` (a port, seconds between polls), else a
    usage error (inf and nan too: `stoke up --poll-seconds nan` would fail as a schedule, after the server started)."""
    def number(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' * (kind is int)}number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not from {low:g} to {high:g}")
        return value
    return number


def config_from(args: argparse.Namespace, **options) -> RunConfig:
    """The configuration the command line describes, not yet resolved (presets apply when it runs).
    `options` are run-wide settings the command's own flags gave (None: not given)."""
    data = config_files.read_file(args.config) if args.config else {}
    given = {"source": args.source, "root": args.root, "preset": args.preset, **options}
    laid = {**data, **{name: value for name, value in given.items() if value is not None}}
    config = config_files.build(RunConfig, config_files.with_overrides(laid, args.overrides, RunConfig))
    if config.source is None:  # a stage by hand may go without SOURCE; a run ingests from it
        raise config_files.ConfigError("source: Field required")
    hybrid = args.config and preset_problem(data, config.preset, args.config)
    if hybrid:
        raise config_files.ConfigError(hybrid)
    try:  # a file network beside the configuration, made the path the flow and a deployment carry
        return network_code.located(config, network_code.folder_of(args.config))
    except ValueError as error:
        raise config_files.ConfigError(str(error)) from None


def add_networks_argument(parser: argparse.ArgumentParser) -> None:
    """`--network`, shared by `stoke up` and `stoke deploy`: the networks of code a run of the deployment may
    choose in its parameters, beside its own train.network (flows/parameters.py check_network_choice)."""
    parser.add_argument("--network", dest="networks", action="append", default=[], metavar="REFERENCE",
                        help="a network a run of the deployment may choose (`prefect deployment run -p "
                             "train='{\"network\": REFERENCE}'`) beside train.network: module:function, or "
                             "path/to/file.py:function beside the configuration (repeatable; built-in networks "
                             "need no listing)")


def listed_networks(args: argparse.Namespace) -> list[str]:
    """The --network references, each checked and found as train.network is (a file beside the configuration)."""
    folder = network_code.folder_of(args.config)
    try:
        return [network_code.locate(check_network(reference), folder) for reference in args.networks]
    except ValueError as error:
        raise config_files.ConfigError(f"--network: {error}") from None


def given_fields(config: BaseModel) -> dict:
    """What a configuration says beyond the defaults, as JSON: a deployment's parameters, which a
    run then lays its own over (flows/pipeline.py configure)."""
    return config.model_dump(mode="json", exclude_unset=True)


def as_yaml(config: BaseModel, indent: str = "") -> str:
    """`config` as YAML, each setting under its help as a comment: a file `--config` takes. A secret setting
    (alerts.webhook), which no record holds, is left out."""
    lines = []
    for name, field in type(config).model_fields.items():
        if field.exclude:
            continue
        value = getattr(config, name)
        about = field.description or (type(value).__doc__ if isinstance(value, BaseModel) else None)
        if about:
            lines.append(f"{indent}# {' '.join(about.split())}")
        if isinstance(value, BaseModel) and model_of(field.annotation) is not None:
            lines += [f"{indent}{name}:", as_yaml(value, indent + "  ").rstrip("\n")]
        else:
            plain = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            lines.append(f"{indent}{name}: {json.dumps(plain)}")
    return "\n".join(lines) + "\n"
