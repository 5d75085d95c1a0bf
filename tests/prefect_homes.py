"""PREFECT_HOME folders for the Prefect servers that tests start (`stoke run`'s temporary one, `stoke up`'s,
`prefect server start`), their SQLite database already made: migrating a new one costs a server seconds
of CPU, the same for every test, and no test is about it. It is made once per test run, by Prefect's
own `prefect server database upgrade`, and copied."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.once import once_per_run

BIN = os.path.dirname(sys.executable)


def migrated_home(tmp_path_factory, folder: Path) -> Path:
    """FOLDER (made if need be) holding a copy of a new, migrated prefect.db."""
    made = once_per_run(tmp_path_factory, "prefect-database", _migrated)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(made["database"], folder / "prefect.db")
    return folder


def _migrated(folder: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "PREFECT_SERVER_DATABASE"))}
    env.update(PREFECT_HOME=str(folder), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    done = subprocess.run([os.path.join(BIN, "prefect"), "server", "database", "upgrade", "-y"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"database": str(folder / "prefect.db")}
