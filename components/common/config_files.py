"""Settings from a file and from `--set group.field=value` overrides, as big_vision takes a config
plus dotted overrides: the file first, then each override in order, then the model validates the
whole. Every mistake is one line naming the dotted path and what it allows.

Settings files are read as plain data: YAML or JSON read into dicts, lists, strings, numbers, booleans
and nulls, nothing else, nested at most MAX_DEPTH deep. A settings file is a few groups of settings.
What YAML can do beyond that is what a hostile or mistaken file uses: an alias repeats a node wherever
it is named, so 342 bytes of aliases of aliases expand to hundreds of MB (and one naming itself never
ends); tags build dates, bytes and sets, which no setting takes and JSON (the recorded config.json)
cannot hold; and lists nested thousands deep exhaust Python's recursion. So aliases, every tag but
JSON's and nesting past MAX_DEPTH are refused where the parser meets them, before anything is built.
PyYAML reads YAML 1.1, where `1:30` is 90 (base 60) and `0755` is 493 (octal), while YAML 1.2 and
JSON read text and 755: such a number is refused, naming both readings, rather than read one way
silently. A key given twice (YAML and JSON readers keep the last one) is refused too, in files and
in --set values alike. YAML 1.1's yes/no/on/off stay booleans: a setting that takes text refuses a
boolean, so they are never misread silently.
"""
from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Hashable, Iterator
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from components.common.files import NotASmallFile, read_small
from components.common.store_errors import transient


class ConfigError(ValueError):
    """Settings that cannot be used; the message is the one line to show."""


MAX_FILE_BYTES = 1024 * 1024  # a settings file is a few KB, a run's config.json some ten
OPTION_FILE_BYTES = 64 * 1024  # a Beam options file, a password, a job template: a few lines each


def read_option_file(path: str, option: str, limit: int = OPTION_FILE_BYTES) -> str:
    """The text of the small file an option such as --beam-args-file names, or a ConfigError naming both:
    a regular UTF-8 file of at most `limit` bytes (a FIFO or /dev/zero would hang or fill memory). A store
    that is away is raised as it is: the weather, which a retry may outlast, not a mistake in the option."""
    try:
        return read_small(path, limit, f"the file of {option}").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{option} {path}: no such file") from None
    except NotASmallFile as error:
        raise ConfigError(f"{option} {error}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{option} {path} is not UTF-8 text") from None
    except OSError as error:
        if transient(error):
            raise
        raise ConfigError(f"{option} {path} cannot be read: {error.strerror or error}") from None


def read_file(uri: str) -> dict:
    """The settings in a YAML or JSON file (a local path or an fsspec URI, such as a run's config.json): a
    regular file of at most MAX_FILE_BYTES, plain data (below), a group of settings."""
    try:
        text = read_small(uri, MAX_FILE_BYTES, "a settings file").decode("utf-8")
        data = loads(text, as_json=uri.endswith(".json"))
    except FileNotFoundError:
        raise ConfigError(f"{uri}: no such file") from None
    except NotASmallFile as error:
        raise ConfigError(str(error)) from None
    except NotPlainData as error:
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
            check_depth(value)
        except RecursionError:
            raise ConfigError(f"--set {path.strip()}: nested more than {MAX_DEPTH} deep") from None
        except NotPlainData as error:
            raise ConfigError(f"--set {path.strip()}: {error}") from None
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
        return json_loads(text)
    except NotPlainData:
        raise
    except ValueError:
        return text


def build(model: type[BaseModel], data: dict):
    """`model` from `data`, or a ConfigError naming the first problems by their dotted paths."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(problems(error, model)) from None


def problems(error: ValidationError, model: type[BaseModel] | None = None, limit: int = 3) -> str:
    """`train.epochs: Input should be greater than 0 (got -1)` for the first few problems, on one line; the
    value given to a secret setting of `model` is not repeated."""
    shown = []
    for problem in error.errors()[:limit]:
        path = ".".join(str(part) for part in problem["loc"] if not isinstance(part, int) or part >= 0) or "settings"
        if problem["type"] == "extra_forbidden":
            shown.append(f"{path}: no such setting")
        else:
            got = problem.get("input")
            echo = isinstance(got, str | int | float) and not _secret(model, problem["loc"])
            shown.append(f"{path}: {said(problem)}" + (f" (got {_shown(got)})" if echo else ""))
    more = len(error.errors()) - limit
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _secret(model: type[BaseModel] | None, loc: tuple) -> bool:
    """Whether `loc` names a setting of `model` that holds a SecretStr (alerts.webhook)."""
    field = None
    for name in loc:
        if model is None or name not in model.model_fields:
            return False
        field = model.model_fields[name]
        model = model_of(field.annotation)
    return field is not None and _holds(field.annotation, SecretStr)


def _holds(annotation, kind: type) -> bool:
    return annotation is kind or any(_holds(arg, kind) for arg in typing.get_args(annotation))


def said(problem: dict) -> str:
    """A validation problem's message as Stoke says it: a check's own words without pydantic's
    "Value error, " before them."""
    return problem["msg"].removeprefix("Value error, ")


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


# ---------------------------------------------------------------- plain data

MAX_DEPTH = 32  # a run configuration is three deep: group, setting, a list's items
JSON_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "str", "seq", "map"))
PLAIN = "settings are text, numbers, true/false, null, lists and groups"
NUMBER_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("int", "float"))
OCTAL = re.compile(r"[-+]?0[0-7_]+")  # YAML 1.1's octal; YAML 1.2 writes 0o755


class NotPlainData(ValueError):
    """Text that is not plain data; the message says what, and on which line."""


def loads(text: str, as_json: bool = False):
    """The plain data in `text`, YAML (or JSON, which YAML reads too, with `as_json` as JSON reads it)."""
    if as_json:
        try:
            data = json_loads(text)
        except RecursionError:
            raise NotPlainData(f"nested more than {MAX_DEPTH} deep") from None
        check_depth(data)
        return data
    return yaml.load(text, Loader=_PlainLoader)  # SafeLoader, narrowed further


def json_loads(text: str):
    """JSON as json.loads reads it, a key given twice in one object refused."""
    return json.loads(text, object_pairs_hook=_once_each)


def _once_each(pairs: list[tuple]) -> dict:
    keys = [key for key, _ in pairs]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        raise NotPlainData(f"{twice!r} is given twice in one group; keep one")
    return dict(pairs)


def check_depth(value, limit: int = MAX_DEPTH) -> None:
    """Raises NotPlainData when lists and dicts in `value` nest more than `limit` deep."""
    if limit < 0:
        raise NotPlainData(f"nested more than {MAX_DEPTH} deep")
    if isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            check_depth(item, limit - 1)


class _PlainLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing only what JSON could say."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = f"line {event.start_mark.line + 1}"
        if isinstance(event, yaml.AliasEvent):
            raise NotPlainData(f"{line}: an alias (*{event.anchor}) repeats another value; write the value out")
        if self.depth >= MAX_DEPTH:
            raise NotPlainData(f"{line}: nested more than {MAX_DEPTH} deep")
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if node.tag not in JSON_TAGS:
            raise NotPlainData(f"{line}: {_what(node)} is no setting's value ({PLAIN})")
        if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag in NUMBER_TAGS:
            self._check_number(node, line)
        return node

    def _check_number(self, node, line: str) -> None:
        """Refuses a plain number YAML 1.1 reads otherwise than YAML 1.2 and JSON."""
        number = self.yaml_constructors[node.tag](self, node)
        if ":" in node.value:
            raise NotPlainData(f"{line}: {node.value} is {number} in YAML 1.1 (a number in base 60) but text in "
                               f"YAML 1.2; write {number}, or quote it for text")
        if OCTAL.fullmatch(node.value) and number != int(node.value.replace("_", "")):
            raise NotPlainData(f"{line}: {node.value} is {number} in YAML 1.1 (an octal number) but "
                               f"{int(node.value.replace('_', ''))} in YAML 1.2; write {number} or "
                               f"{int(node.value.replace('_', ''))}")

    def construct_mapping(self, node, deep=False):
        """A group, each key in it once: YAML readers keep the last of a key given twice, silently."""
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):  # an unhashable key is PyYAML's own error
                if key in seen:
                    raise NotPlainData(f"line {key_node.start_mark.line + 1}: {key} is given twice in one group; "
                                       "keep one")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _what(node) -> str:
    tag = node.tag.replace("tag:yaml.org,2002:", "!!")
    if tag == "!!timestamp":
        return f"a date ({node.value}; quote it to mean text)"
    if tag == "!!merge":
        return "a merge key (<<)"
    return f"the tag {tag}"
