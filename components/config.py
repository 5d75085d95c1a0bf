"""Typed settings of each stage: Prefect renders them as flow parameters, the CLI as options.

Each field's description is its help text in both places. `add_arguments` and `from_arguments`
turn a model into argparse options and back, so a setting is declared once.
"""
from __future__ import annotations

import argparse
import types
import typing
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class IngestConfig(BaseModel):
    """Raw images to a new span of sharded TFRecords."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        description="folder of class subfolders, or a CSV/JSONL manifest of uri,label[,split]; "
        "a local path or an fsspec URI (s3://, gs://)"
    )
    root: str = Field(description="artifact ROOT: local path or fsspec URI")
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of sources for eval, by path hash")
    shard_mb: float = Field(128.0, gt=0, description="target size of one shard file in MB")
    max_side: int | None = Field(None, gt=0, description="shrink images whose longer side is larger")
    max_bad_fraction: float = Field(
        0.05, ge=0.0, le=1.0, description="fail, publishing nothing, when more sources than this are bad"
    )
    compression: Literal["gzip", "zlib", "none"] = Field("gzip", description="codec of the shard files")


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], positional=()) -> None:
    """Adds one option per field of `model` (`--shard-mb`), or a positional argument."""
    for name, field in model.model_fields.items():
        kind, choices = _argument_type(field.annotation)
        help_text = field.description or ""
        if name in positional:
            parser.add_argument(name, type=kind, help=help_text)
            continue
        flag = "--" + name.replace("_", "-")
        required = field.is_required()
        if not required:
            help_text += f" (default: {field.default})"
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                default=field.default, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=kind, choices=choices, required=required,
                                default=None if required else field.default, help=help_text)


def from_arguments(model: type[BaseModel], namespace: argparse.Namespace):
    """Builds `model` from parsed arguments; pydantic validates ranges and types."""
    return model(**{name: getattr(namespace, name) for name in model.model_fields})


def _argument_type(annotation):
    """The argparse type and choices for a field annotation such as `int | None` or a Literal."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = args[0]
        args = list(typing.get_args(annotation))
    if typing.get_origin(annotation) is Literal:
        return type(args[0]), list(args)
    return annotation, None
