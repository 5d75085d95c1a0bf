"""Settings from a file and from `--set group.field=value` overrides, as big_vision takes a config
plus dotted overrides: the file first, then each override in order, then the model validates the
whole. Every mistake is one line naming the dotted path and what it allows."""
from __future__ import annotations

import difflib
import json

from pydantic import BaseModel, ValidationError

from components.contracts import plain_data
from components.contracts.options import argument_type, model_of


class ConfigError(ValueError):
    """Settings that cannot be used; the message is the one line to show."""


MAX_FILE_BYTES = 1024 * 1024  # a settings file is a few KB, a run's config.json some ten


def read_file(uri: str) -> dict:
    """The settings in a YAML or JSON file (a local path or an fsspec URI, such as a run's config.json): a
    regular file of at most MAX_FILE_BYTES, plain data (components/contracts/plain_data.py), a group of settings."""
    import yaml

    from components.common.files import NotASmallFile, read_small

    try:
        text = read_small(uri, MAX_FILE_BYTES, "a settings file").decode("utf-8")
        data = plain_data.loads(text, as_json=uri.endswith(".json"))
    except FileNotFoundError:
        raise ConfigError(f"{uri}: no such file") from None
    except NotASmallFile as error:
        raise ConfigError(str(error)) from None
    except plain_data.NotPlainData as error:
        raise ConfigError(f"{uri}: {error}") from None
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as error:
        raise ConfigError(f"{uri} is not a YAML or JSON file of settings: {_first_line(error)}") from None
    except OSError as error:
        raise ConfigError(f"{uri} cannot be read: {error.strerror or error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{uri} holds a {type(data).__name__}, not settings (group: {{field: value}})")
    return data


def with_overrides(data: dict, overrides: list[str], model: type[BaseModel]) -> dict:
    """`data` with each `path=value` laid over it; the value is read as JSON where it parses, else a string
    (and as it is for a setting that is a string, so `train.spans=3` is the text "3"; `null` stays null)."""
    data = json.loads(json.dumps(data))  # a copy the overrides may change
    for item in overrides:
        path, equals, text = item.partition("=")
        if not equals or not path.strip():
            raise ConfigError(f"--set {item!r}: GROUP.FIELD=VALUE is needed, e.g. train.epochs=3")
        names = path.strip().split(".")
        try:
            value = _value(text, check_path(model, names))
            plain_data.check_depth(value)
        except (plain_data.NotPlainData, RecursionError):
            raise ConfigError(f"--set {path.strip()}: nested more than {plain_data.MAX_DEPTH} deep") from None
        node = data
        for name in names[:-1]:
            if not isinstance(node.get(name), dict):
                node[name] = {}
            node = node[name]
        node[names[-1]] = value
    return data


def check_path(model: type[BaseModel], names: list[str]):
    """The field at the path `names` of `model` (a setting or a group), or a ConfigError naming the path."""
    field = None
    for depth, name in enumerate(names):
        if model is None:
            raise ConfigError(f"{'.'.join(names)}: {'.'.join(names[:depth])} is a single setting, not a group")
        if name not in model.model_fields:
            raise ConfigError(f"{'.'.join(names)}: no such setting{_choices(model, name, names[:depth])}")
        field = model.model_fields[name]
        model = model_of(field.annotation)
    return field


def _value(text: str, field):
    """An override's value: JSON where it parses, else the text; a string setting takes the text as it is."""
    if text == "null":
        return None
    if model_of(field.annotation) is None and argument_type(field.annotation)[0] is str and not text.startswith('"'):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def build(model: type[BaseModel], data: dict):
    """`model` from `data`, or a ConfigError naming the first problems by their dotted paths."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(problems(error)) from None


def problems(error: ValidationError, limit: int = 3) -> str:
    """`train.epochs: Input should be greater than 0 (got -1)` for the first few problems, on one line."""
    shown = []
    for problem in error.errors()[:limit]:
        path = ".".join(str(part) for part in problem["loc"] if not isinstance(part, int) or part >= 0) or "settings"
        if problem["type"] == "extra_forbidden":
            shown.append(f"{path}: no such setting")
        else:
            got = problem.get("input")
            shown.append(f"{path}: {problem['msg']}" + (f" (got {_shown(got)})" if isinstance(got, str | int | float) else ""))
    more = len(error.errors()) - limit
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def deep_merge(base: dict, top: dict) -> dict:
    """`base` with `top` laid over it, group by group."""
    merged = dict(base)
    for key, value in top.items():
        merged[key] = deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def _choices(model: type[BaseModel], name: str, where: list[str]) -> str:
    near = difflib.get_close_matches(name, list(model.model_fields), n=1)
    prefix = ".".join(where) + "." if where else ""
    if near:
        return f"; did you mean {prefix}{near[0]}? (`stoke config show` lists every setting)"
    return f" in {'.'.join(where) or 'the run configuration'}: one of {', '.join(model.model_fields)}"


def _shown(value, limit: int = 80) -> str:
    """`value` as Python writes it, cut to `limit` characters: the line stays one a terminal shows."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text):,} characters)"


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
