"""Command-line options generated from a settings model, for running a stage program by hand.

Each field is one option named after it (`shard_mb` -> `--shard-mb`), a nested group's fields by
their path (`shard_cache.dir` -> `--shard-cache-dir`); its description is the help. Options left
out stay out of the namespace (argparse.SUPPRESS), so `given` returns only what the command line
said, to lay over a settings file.
"""
from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

SEPARATOR = "."  # in argparse's dest: the path of a field within nested groups


def add_options(parser: argparse.ArgumentParser, model: type[BaseModel], positional=(), first=()) -> None:
    """One option per setting of `model` (its `first` fields listed first), or a positional argument."""
    fields = sorted(leaves(model), key=lambda item: item[0][0] not in first)
    for path, field in fields:
        dest, flag = SEPARATOR.join(path), option(path)
        kind, choices = argument_type(field.annotation)
        help_text = (field.description or "") + _default(field)
        if path[0] in positional:
            parser.add_argument(dest, type=kind, nargs="?", default=argparse.SUPPRESS, help=help_text)
        elif kind is bool:
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=dest, type=kind, choices=choices, default=argparse.SUPPRESS,
                                metavar=None if choices else dest.rsplit(SEPARATOR, 1)[-1].upper(), help=help_text)


def given(options: dict) -> dict:
    """The settings the command line gave (argparse's dests and values), nested by path:
    {"shard_cache": {"dir": ...}, "epochs": 3}."""
    found: dict = {}
    for dest, value in options.items():
        *groups, name = dest.split(SEPARATOR)
        node = found
        for group in groups:
            node = node.setdefault(group, {})
        node[name] = value
    return found


def option(path) -> str:
    """The option of a setting: ("shard_cache", "max_gb") or "max_gb" -> --shard-cache-max-gb."""
    parts = [path] if isinstance(path, str) else path
    return "--" + "-".join(parts).replace("_", "-")


def setting_hint(stage: str | None, values: dict) -> str:
    """Settings as a hint shows them, each form runnable as printed by the command it is for: `--set
    GROUP.FIELD=VALUE` for `stoke run` (and `stoke up`, `stoke deploy`), then the stage's program by hand.
    `values` maps a setting's path (`train.image_cache`) to its value (text, a number or a bool):
    `--set train.image_cache=memory` (by hand: `stoke train --image-cache memory`). Without a `stage` (a
    run-wide setting that several programs take) the hand form is the option alone."""
    overrides, flags = [], []
    for path, value in values.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        overrides.append(f"--set {path}={text}")
        parts = path.split(SEPARATOR)
        flag = option(parts[1:] if parts[0] == stage else parts)
        if isinstance(value, bool):
            flags.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            flags.append(f"{flag} {text}")
    command = f"stoke {stage} " if stage else ""
    return f"`{' '.join(overrides)}` (by hand: `{command}{' '.join(flags)}`)"


def leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], FieldInfo]]:
    """(path, field) of every single setting of `model`, groups walked into."""
    for name, field in model.model_fields.items():
        group = model_of(field.annotation)
        if group is None:
            yield (*prefix, name), field
        else:
            yield from leaves(group, (*prefix, name))


def model_of(annotation) -> type[BaseModel] | None:
    """The model of a group's annotation, such as `TrainConfig` or `PreflightConfig | None`; None for a setting."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return " (required)"
    if field.default is None:  # the description says what happens
        return ""
    return f" (default: {field.default})"


def argument_type(annotation):
    """The argparse type and choices for a field annotation such as `int | None` or a Literal."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = args[0]
        args = list(typing.get_args(annotation))
    if typing.get_origin(annotation) is Annotated:  # RunId: the pattern is pydantic's to check
        annotation = args[0]
        args = list(typing.get_args(annotation))
    if typing.get_origin(annotation) is Literal:
        return type(args[0]), list(args)
    return annotation, None
