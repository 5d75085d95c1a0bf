"""`stoke run` into a ROOT whose disk is really full (tests/full_disk.py): one line naming what could not be
written and what to do, the command to run again as it ran, no traceback; a report that cannot be written
says so without hiding why the run failed; and the printed command, run as printed once there is space,
finishes the night with the same run id. Real processes against the session's Prefect test server, on a copy
of the first run's ROOT, where nothing is new: the night after the fill ends early, trained on."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

from components.contracts.layout import Root
from tests.flows.conftest import copy_of
from tests.flows.test_one_line_errors import BIN
from tests.full_disk import small_disk

PAGE = 4096


def stoke_run(source: str, root: str) -> tuple[list[str], subprocess.CompletedProcess]:
    command = ["stoke", "run", source, "--root", root, "--no-preflight", "--skip-unchanged", "--run-id", "night",
               "--json"]
    return command, _stoke(command)


def _stoke(command: list[str]) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    return subprocess.run([os.path.join(BIN, "stoke"), *command[1:]], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()})


def failed_for_space(done: subprocess.CompletedProcess, line: str) -> list[str]:
    """The run failed in one line: `line` (a pattern), then what to do, ending with the command to run it again
    (returned)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr and len(lines) < 20, done.stderr
    assert re.match(f"stoke run: error: {line}; free space under ROOT, then run it again: `stoke run ", lines[-1]), lines
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == "failed"
    return shlex.split(lines[-1].split("run it again: ")[1].strip("`"))


def runs_the_night(command: list[str]) -> None:
    done = _stoke(command)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == "night" and summary["status"] == "skipped", summary


def test_a_root_on_a_full_disk_is_one_line_and_the_command_it_prints_runs_once_there_is_space(pushed_run, tmp_path):
    """Full before the run: the flow's first write, the run's lease, fails; nothing of it is left."""
    source = str(tmp_path / "digits")
    shutil.copytree(pushed_run["source"], source)
    with small_disk(tmp_path / "disk") as disk:
        root = os.path.join(disk.path, "root")
        shutil.copytree(pushed_run["root"], root)
        disk.fill()
        given, done = stoke_run(source, root)
        night = os.path.join(root, "runs", "night")
        lease = re.escape(f"{root}/runs/.running/") + r"[0-9a-f-]{36}\.lock"
        command = failed_for_space(done, f"{lease} cannot be written: no space left on device")
        assert command == given and not os.path.exists(night) and os.listdir(Root(root).running_leases) == []
        disk.free()
        runs_the_night(command)


def test_a_run_folder_full_after_its_configuration_fails_in_one_line_and_the_report_says_it_is_unwritten(
        pushed_run, tmp_path):
    """Room for the configuration alone: the ingest's result, kept by the flow, fails, then the report, tried once.
    The report's failure is a line of its own; the run's last line stays the ingest's."""
    source, root = copy_of(pushed_run, tmp_path)
    night = os.path.join(root, "runs", "night")
    with small_disk(night) as disk:
        disk.fill(room=PAGE)
        given, done = stoke_run(source, root)
        command = failed_for_space(done, re.escape(f"{night}/ingest.json cannot be written: no space left on device"))
        unwritten = [line for line in done.stderr.splitlines() if "the report could not be written: " in line]
        assert len(unwritten) == 1 and f"{night}/" in unwritten[0] and "no space left on device" in unwritten[0]
        assert "Retry" not in done.stderr  # a full disk refuses the next try as well
        assert command == given and sorted(os.listdir(night)) == [".filler", "config.json"]
        disk.free()
        runs_the_night(command)
        assert os.path.exists(os.path.join(night, "report.json"))


def test_what_to_do_names_the_place_and_the_command_runs_the_same_run_again():
    from flows.commands import run_again, what_to_do

    again = run_again(["stoke", "run", "/my photos", "--root", "/r", "--skip-unchanged"], "night")
    assert again == "run it again: `stoke run '/my photos' --root /r --skip-unchanged --run-id night`"
    assert run_again(["stoke", "run", "/in", "--run-id=night"], "night") == "run it again: `stoke run /in --run-id=night`"
    # A command with a credential in it would print hidden, and fail as printed: what to add is said instead.
    for source in ("https://ana:2024;Winter@photos.example/in.csv", "s3://in/m.csv?X-Amz-Signature=abc123",
                   "https://photos.example/in.csv?sig=abc123&x=1"):
        said = run_again(["stoke", "run", source, "--root", "/r"], "night")
        assert said == "run the same command again with `--run-id night` added (it holds a credential, not printed here)"
        assert run_again(["stoke", "run", source, "--run-id", "n"], "n") == \
            "run the same command again (it holds a credential, not printed here)"
    said = {
        "push: /r/models/m/.push-1/saved_model.pb cannot be written: no space left on device": "under ROOT",
        "train: /cache/runs/n/candidate cannot be written: disk quota exceeded": "there",  # the shard cache's disk
        "gate: [Errno 28] No space left on device": "under ROOT",  # a runner's words, naming no file
    }
    for line, where in said.items():
        assert what_to_do(line, "/r", again) == f"{line}; free space {where}, then {again}"
    for line in ("/r/runs/n/config.json cannot be written: read-only file system", "ingest: no images in /in"):
        assert what_to_do(line, "/r", again) == line
