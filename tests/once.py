"""What a test run makes once for all of its processes: `make test` runs the tests on pytest-xdist
workers, and a session fixture that trains models or runs a whole flow would run once on each."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path


def once_per_run(tmp_path_factory, name: str, make: Callable[[Path], dict]) -> dict:
    """What `make(folder)` returned, as JSON: the first process of the run that asks calls it, in a folder
    of the run's temporary folder, holding a lock; every other process waits for the lock and reads
    the record. What `make` leaves in the folder is read by every worker at once: tests that change it
    work on a copy."""
    run = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run = run.parent  # each worker's own temporary folder lies in the run's
    with open(run / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = run / f"{name}.json"
        if not record.exists():
            folder = run / name
            if folder.exists():  # a process that made it before failed: its own test says why
                raise RuntimeError(f"{name} failed in another process of this test run: see its first error")
            folder.mkdir()
            made = make(folder)
            record.write_text(json.dumps(made))  # last: a record means it was made whole
        return json.loads(record.read_text())
