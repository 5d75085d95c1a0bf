"""What `make install` installs is what `stoke` imports: deptry (`make test`, configured in pyproject.toml)
checks the imports against the declared dependencies, and tests/runtime_only.py runs a command without the
packages only the test extras bring."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from flows.cli import BENCHES
from tests import runtime_only


def test_the_dependency_check_reads_every_program_stoke_bench_runs():
    settings = tomllib.loads(runtime_only.PYPROJECT.read_text())["tool"]["deptry"]
    excluded = re.compile("|".join(settings["extend_exclude"]))  # deptry matches each from a path's start
    assert BENCHES and not [module for module in BENCHES.values() if excluded.match(module.replace(".", "/") + ".py")]


def test_a_runtime_only_process_lacks_the_test_tools_and_has_the_runtime_dependencies(tmp_path):
    blocked = runtime_only.test_only_modules()
    assert {"moto", "pytest", "hypothesis", "deptry", "skimage"} <= blocked
    assert not {"boto3", "yaml", "tensorflow", "apache_beam", "prefect", "s3fs", "google", "psutil"} & blocked
    probe = ("import boto3, yaml, psutil\n"
             "for name in ('moto', 'pytest'):\n"
             "    try:\n        __import__(name)\n    except ModuleNotFoundError as error:\n        print(error)\n")
    done = subprocess.run([sys.executable, "-c", probe], env=runtime_only.environment(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"No module named {name!r} (only the test extras install it)"
                                        for name in ("moto", "pytest")]
