"""A child process that has only what `make install` installs: the modules that only the test extras'
packages bring (moto, pytest, docker, kubernetes...) are unimportable there, through a sitecustomize.py on
its PYTHONPATH, which Python imports as it starts. A command run so shows that it works on pyproject.toml's
own dependencies, not on a package a test tool happened to bring along."""
from __future__ import annotations

import importlib.metadata as metadata
import os
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

SITECUSTOMIZE = '''import sys

TEST_ONLY = frozenset({modules!r})


class TestToolsAbsent:
    """Finds no module that only the test extras install."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in TEST_ONLY:
            raise ModuleNotFoundError(f"No module named {{name!r}} (only the test extras install it)", name=name)
        return None


sys.meta_path.insert(0, TestToolsAbsent())
'''


def environment(folder: Path) -> dict[str, str]:
    """os.environ for a child process that imports only what the runtime dependencies install."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(modules=sorted(test_only_modules())))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def test_only_modules() -> set[str]:
    """The top-level modules of the packages the test extras install beyond the runtime dependencies."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    runtime = installed(project["dependencies"])
    tools = installed(project["optional-dependencies"]["test"]) - runtime
    return set().union(*map(modules, tools)) - set().union(*map(modules, runtime))


def installed(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements bring, theirs included, by canonical name."""
    followed: dict[str, set[str]] = {}  # distribution -> the extras whose requirements were followed
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        name, extras = canonicalize_name(requirement.name), set(requirement.extras)
        if name in followed and extras <= followed[name]:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # another platform's, or an extra nobody installed
            continue
        followed[name] = followed.get(name, set()) | extras
        for text in distribution.requires or []:
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra})
                                             for extra in ("", *followed[name])):
                needed.marker = None
                pending.append(needed)
    return set(followed)


def modules(name: str) -> set[str]:
    """The top-level modules of an installed distribution."""
    distribution = metadata.distribution(name)
    listed = distribution.read_text("top_level.txt")
    if listed:
        return {line.strip() for line in listed.splitlines() if line.strip()}
    found = set()
    for file in distribution.files or []:
        first = file.parts[0]
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".egg-info", ".data")):
            continue
        if len(file.parts) > 1:
            found.add(first)
        elif file.suffix in (".py", ".so"):
            found.add(file.name.split(".")[0])
    return found
