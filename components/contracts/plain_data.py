"""Settings files as plain data: YAML or JSON read into dicts, lists, strings, numbers, booleans and nulls,
nothing else, nested at most MAX_DEPTH deep.

A settings file is a few groups of settings. What YAML can do beyond that is what a hostile or mistaken
file uses: an alias repeats a node wherever it is named, so 342 bytes of aliases of aliases expand to
hundreds of MB (and one naming itself never ends); tags build dates, bytes and sets, which no setting
takes and JSON (the recorded config.json) cannot hold; and lists nested thousands deep exhaust Python's
recursion. So aliases, every tag but JSON's and nesting past MAX_DEPTH are refused where the parser meets
them, before anything is built.
"""
from __future__ import annotations

import json

import yaml

MAX_DEPTH = 32  # a run configuration is three deep: group, setting, a list's items
JSON_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "str", "seq", "map"))
PLAIN = "settings are text, numbers, true/false, null, lists and groups"


class NotPlainData(ValueError):
    """Text that is not plain data; the message says what, and on which line."""


def loads(text: str, as_json: bool = False):
    """The plain data in `text`, YAML (or JSON, which YAML reads too, with `as_json` as JSON reads it)."""
    if as_json:
        try:
            data = json.loads(text)
        except RecursionError:
            raise NotPlainData(f"nested more than {MAX_DEPTH} deep") from None
        check_depth(data)
        return data
    return yaml.load(text, Loader=_PlainLoader)  # SafeLoader, narrowed further


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
        return node


def _what(node) -> str:
    tag = node.tag.replace("tag:yaml.org,2002:", "!!")
    if tag == "!!timestamp":
        return f"a date ({node.value}; quote it to mean text)"
    if tag == "!!merge":
        return "a merge key (<<)"
    return f"the tag {tag}"
