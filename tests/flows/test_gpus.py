"""This machine's GPU slot dies with its holder: a run killed outright (SIGKILL) frees it for the next
one at once, and a stage program that inherits it holds it as long as it runs."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading

from flows.gpu_slot import gpu_slot
from tests.flows.conftest import TINY_BEAM
from tests.prefect_homes import migrated_home
from tests.waiting import first_line, wait_for

BIN = os.path.dirname(sys.executable)
HOLD = ("import logging, sys, time\nfrom flows.gpu_slot import gpu_slot\n"
        "with gpu_slot(logging.getLogger('x'), 'holder'):\n    print('held', flush=True)\n    time.sleep(600)\n")


def taken_within(seconds: float) -> bool:
    """Whether this process gets the slot within `seconds` (it polls the lock once a second)."""
    got = threading.Event()

    def take():
        with gpu_slot(logging.getLogger("test"), "test"):
            got.set()
    threading.Thread(target=take, daemon=True).start()
    return got.wait(seconds)


def test_a_holder_killed_outright_frees_the_slot_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKE_GPU_LOCK", str(tmp_path / "gpus.lock"))
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    assert first_line(holder, "the holder to take the slot") == "held"
    assert not taken_within(2.0)  # held: the next waits
    assert json.load(open(tmp_path / "gpus.lock"))["holder"] == "holder"
    holder.kill()
    holder.wait()
    assert taken_within(60.0)  # at once; the bound is for a machine busy with other work


def test_a_program_that_inherits_the_slot_holds_it_after_its_starter_let_go(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKE_GPU_LOCK", str(tmp_path / "gpus.lock"))
    with gpu_slot(logging.getLogger("test"), "starter") as fd:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=(fd,))
    try:
        assert not taken_within(2.0)  # the starter closed its file; the child still holds the lock
    finally:
        child.kill()
        child.wait()
    assert taken_within(60.0)


def _trainer_of(pid: int) -> int | None:
    """The pid of the `components.train` program started (through the flow) by process `pid`."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "-m components.train" in command and parent == pid:
            return int(entry)
    return None


def test_a_run_killed_during_training_leaves_the_next_one_free_to_train(digits, tmp_path, tmp_path_factory):
    root = str(tmp_path / "root")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(migrated_home(tmp_path_factory, tmp_path / "prefect-home")),
               STOKE_GPU_LOCK=str(tmp_path / "gpus.lock"),
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    common = [os.path.join(BIN, "stoke"), "run", digits, "--root", root, "--no-preflight", "--preset", "demo",
              "--set", f"beam_args={json.dumps(TINY_BEAM)}", "--set", "train.input_probe_steps=0",
              "--set", "train.trace_steps=none", "--set", "train.epochs=500"]
    _kill_once_training(common, "killed", env)
    # The next run on the same ROOT and Prefect home takes the slot: its trainer starts only inside it.
    # That is all it has to show; what a whole run does after training, other tests show.
    _kill_once_training(common, "next", env)


def _kill_once_training(command: list[str], run_id: str, env: dict) -> None:
    """Starts `command` as run `run_id`, waits for its trainer, kills the run outright (SIGKILL, no
    cleanup of its own) and waits for the trainer to stop with it."""
    # Its own process group, so the test can end whatever the kill leaves behind (Prefect's temporary
    # server, started by `stoke run` itself, has no way to learn that its parent died).
    run = subprocess.Popen([*command, "--run-id", run_id], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        trainer = wait_for(lambda: _trainer_of(run.pid), f"run {run_id} to start training", 300, process=run)
        run.kill()
        run.wait()
        wait_for(lambda: not os.path.exists(f"/proc/{trainer}") or _zombie(trainer), "its trainer to stop with it", 60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_sigterm_to_the_stoke_command_reaches_the_program(tmp_path):
    """`stoke train` becomes the program (exec): Kubernetes' SIGTERM to the container's command stops
    the trainer itself, not a wrapper that leaves it running."""
    program = subprocess.Popen([os.path.join(BIN, "stoke"), "train", "--root", str(tmp_path), "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: b"components.train" in open(f"/proc/{program.pid}/cmdline", "rb").read(),
             "the command to become the program", 30, every=0.05)  # the same process, now the program
    program.send_signal(signal.SIGTERM)  # while it loads TensorFlow: Python's default, it ends
    program.wait(timeout=60)
    assert program.returncode == -signal.SIGTERM
