"""The suite's own machinery, under the pytest-xdist options `make test` uses: a test file's tests
share one worker, the long files start first, and each worker holds a GPU slot of its own."""
from __future__ import annotations

import collections
import os
import re
import shlex
import subprocess
import sys

from tests import conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The suite's hooks, with test_b.py as the one long file.
CONFTEST = """import tests.conftest
tests.conftest.LONG_FILES = ("test_b.py",)
from tests.conftest import environment_as_found, gpu_slot_of_this_session, pytest_collection_modifyitems  # noqa: E402,F401,E501
"""
RECORD = """import os

def test_{name}_{index}():
    with open(os.path.join(os.environ["RECORDS"], "{name}-{index}"), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " " + os.environ["STOKE_GPU_LOCK"])
"""


def make_test_options() -> list[str]:
    """The worker and distribution options of the Makefile's pytest line, on two workers."""
    (line,) = re.findall(r"^\t\$\(PY\) -m pytest (.*?)(?: \|\|.*)?$", open(os.path.join(REPO, "Makefile")).read(),
                         re.MULTILINE)
    options = shlex.split(line.replace("$(TEST_WORKERS)", "2"))
    return [option for option in options if option not in ("-q",)]


def _pytest(suite, *args: str, **env: str | None) -> subprocess.CompletedProcess:
    """pytest on `suite` in a process of its own, with `env` laid over this one's (None: unset)."""
    environ = {**os.environ, "PYTHONPATH": REPO, "STOKE_GPU_LOCK": None, **env}  # the inner session's own slot
    environ = {name: value for name, value in environ.items() if value is not None}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(suite), *args,
                           str(suite)], cwd=suite, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_a_files_tests_share_a_worker_and_the_long_files_come_first(tmp_path):
    suite, records = tmp_path / "suite", tmp_path / "records"
    suite.mkdir()
    records.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name in ("a", "b"):
        (suite / f"test_{name}.py").write_text("\n\n".join(RECORD.format(name=name, index=i) for i in range(3)))

    _pytest(suite, *make_test_options(), f"--basetemp={tmp_path / 'base'}", RECORDS=str(records))
    ran = {path.name: path.read_text().split() for path in records.iterdir()}
    workers = collections.defaultdict(set)
    for test, (worker, _) in ran.items():
        workers[test[0]].add(worker)
    assert len(ran) == 6 and workers["a"] != workers["b"]
    assert all(len(found) == 1 for found in workers.values()), workers  # each file on one worker
    locks = {lock for _, lock in ran.values()}  # one slot per worker, in its session's own folder
    assert len(locks) == 2 and all(lock.startswith(str(tmp_path / "base") + os.sep) for lock in locks), locks

    collected = _pytest(suite, "--collect-only", "-q").stdout.splitlines()
    assert [line.split("::")[0] for line in collected if "::" in line] == ["test_b.py"] * 3 + ["test_a.py"] * 3


def test_every_long_file_exists():
    """A renamed file would fall back into collection order without a word."""
    for path in conftest.LONG_FILES:
        assert os.path.isfile(os.path.join(REPO, path)), path


def test_a_variable_a_test_sets_is_gone_for_the_next(tmp_path):
    """A `stoke run` called in-process sets PREFECT_HOME for the rest of the process, as the command
    does for its children; the next test on the worker must not find it."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_order.py").write_text("""import os

def test_sets():
    os.environ["PREFECT_HOME"] = "/somewhere/else"
    os.environ.pop("STOKE_SESSION_SET", None)

def test_finds_the_sessions_environment():
    assert "PREFECT_HOME" not in os.environ and os.environ["STOKE_SESSION_SET"] == "1"
""")
    _pytest(suite, STOKE_SESSION_SET="1", PREFECT_HOME=None)
