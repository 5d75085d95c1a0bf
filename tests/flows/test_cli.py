"""`stoke run`: the train flow from the command line, its JSON summary last. `stoke up`: a real
Prefect server on 127.0.0.1 with its SQLite under PREFECT_HOME, the deployments served beside it,
`prefect deployment run` from another shell, and a clean Ctrl-C."""
from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from components.common.files import read_json
from components.common.spans import Spans
from components.contracts.layout import Root
from tests.flows.conftest import copy_of, one_class_night
from tests.prefect_homes import migrated_home
from tests.waiting import free_port, listening, wait_for

BIN = os.path.dirname(sys.executable)


def test_run_passes_its_configuration_to_the_flow_and_prints_the_summary_last(pushed_run, tmp_path, tmp_path_factory):
    """A scheduled-style run (--skip-unchanged) on a night of one class, sevens only: it is checked and
    trained on with the warning of its mix, and nothing is left unchecked for the next night."""
    source, root = copy_of(pushed_run, tmp_path)
    sevens = one_class_night(source, tmp_path / "pool")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(migrated_home(tmp_path_factory, tmp_path / "prefect-home"))  # its own ephemeral server and database
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", source, "--root", root,
                           "--config", pushed_run["config_file"], "--skip-unchanged", "--no-preflight", "--run-id",
                           "from-cli", "--set", "ingest.compression=zlib", "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == "from-cli" and summary["status"] in ("pushed", "refused")
    assert summary["stages"][:4] == ["ingest", "datacheck", "train", "gate"]
    run = Root(root).run("from-cli")
    (night,) = read_json(run.result("datacheck"))["spans"]
    assert (night["span"], night["status"], night["label_counts"]) == (2, "warning", {"seven": sevens})
    assert night["label_check"]["status"] == "done" and "span 2: warning" in done.stderr
    assert read_json(run.metrics)["spans"] == [1, 2] and Spans(root).unchecked() == []
    recorded = read_json(run.config)
    assert recorded["ingest"]["compression"] == "zlib" and recorded["preflight"] is None
    assert recorded["preset"] == "demo" and recorded["train"]["network"] == "small_cnn"  # from the file, resolved
    assert f"ingest: -m beam_jobs.ingest --config {run.config} " in done.stderr  # what ingest was handed, in the log


def test_run_refuses_a_run_id_that_leaves_runs_before_writing_anything(tmp_path):
    (tmp_path / "images").mkdir()
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", str(tmp_path / "images"), "--root",
                           str(tmp_path / "a" / "root"), "--run-id", "../../x", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "bad run id '../../x'" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_the_flow_refuses_a_run_id_that_leaves_runs(tmp_path):
    from flows.pipeline import pipeline

    state = pipeline(source=str(tmp_path), root=str(tmp_path / "root"), run_id="../x", preflight=None,
                     return_state=True)
    assert state.is_failed() and "bad run id" in str(state.result(raise_on_failure=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_up_serves_the_deployments_until_ctrl_c(pushed_run, tmp_path, tmp_path_factory):
    source, root = copy_of(pushed_run, tmp_path)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    home = migrated_home(tmp_path_factory, tmp_path / "prefect-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(home), PREFECT_RUNNER_POLL_FREQUENCY="1")
    secret = tmp_path / "auth"
    secret.write_text("stoke:s3cret\n")
    up = subprocess.Popen([os.path.join(BIN, "stoke"), "up", "--source", source, "--root",
                           root, "--config", pushed_run["config_file"], "--set", "train.epochs=2",
                           "--port", str(port), "--poll-seconds", "3600", "--auth-string-file", str(secret), "--json"],
                          stdout=subprocess.PIPE, text=True, env=env)
    try:
        nightly = wait_for(lambda: _get(f"{api}/deployments/name/train/nightly"), "stoke up to serve train/nightly", 180,
                           process=up)
        with pytest.raises(urllib.error.HTTPError, match="401"):  # basic auth: nobody else starts runs
            urllib.request.urlopen(f"{api}/deployments/name/train/nightly", timeout=5)
        assert nightly["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
        parameters = nightly["parameters"]
        assert (parameters["source"], parameters["root"], parameters["preset"]) == (source, root, "demo")
        assert parameters["skip_unchanged"] and parameters["train"]["epochs"] == 2  # --set over the file's 1
        assert parameters["train"]["steps_per_epoch"] == 4 and "network" not in parameters["train"]  # unresolved

        # From another shell, with one training setting of its own laid over the deployment's: nothing is
        # new and a model is served, so the run ends early, Completed, and records what it was asked.
        started = subprocess.run([os.path.join(BIN, "prefect"), "deployment", "run", "train/nightly", "--watch",
                                  "-p", 'train={"seed": 7}'],
                                 env={**env, "PREFECT_API_URL": api, "PREFECT_API_AUTH_STRING": "stoke:s3cret"},
                                 capture_output=True, text=True, timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr
        # The scheduler has also queued tonight's run; it stays Scheduled.
        (run,) = [r for r in _post(f"{api}/flow_runs/filter", {})
                  if r["deployment_id"] == nightly["id"] and r["state_type"] != "SCHEDULED"]
        assert run["state_type"] == "COMPLETED"
        (report,) = glob.glob(os.path.join(root, "runs", f"*-{run['name']}", "report.json"))
        assert json.load(open(report))["status"] == "skipped"
        recorded = json.load(open(os.path.join(os.path.dirname(report), "config.json")))
        assert (recorded["train"]["seed"], recorded["train"]["epochs"], recorded["train"]["network"]) == (7, 2, "small_cnn")
        automations = [a["name"] for a in _post(f"{api}/automations/filter", {})]
        assert automations == ["train when data arrives"]  # no alerts.webhook: no alerts, said in the banner
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=90)

    assert up.returncode == 0 and "s3cret" not in out
    assert out.count("No alerts: set alerts.webhook to hear of train/nightly's failures") == 1
    assert json.loads(out.strip().splitlines()[-1]) == {
        "api_url": api, "ui_url": api[:-4], "prefect_home": str(home), "source": source,
        "root": root, "deployments": ["train/nightly", "watch-bucket/poll"], "stopped": True}
    with contextlib.closing(sqlite3.connect(home / "prefect.db")) as database:  # the server kept its runs there
        assert database.execute("SELECT count(*) FROM flow_run WHERE id = ?", (run["id"],)).fetchone() == (1,)
    assert not listening(port), "the server still listens after Ctrl-C"


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is PID."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found.append((int(entry), command))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_up_killed_outright_takes_its_server_down(tmp_path, tmp_path_factory):
    """SIGKILL (or a container stop past its grace period) gives `stoke up` no chance to stop its
    Prefect server; the server must end with it instead of holding the port, orphaned."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(migrated_home(tmp_path_factory, tmp_path / "home")))
    (tmp_path / "in").mkdir()
    up = subprocess.Popen([os.path.join(BIN, "stoke"), "up", "--source", str(tmp_path / "in"), "--root",
                           str(tmp_path / "root"), "--port", str(port), "--poll-seconds", "3600"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for(lambda: listening(port), "the Prefect server of stoke up", 180, process=up)
        (server,) = [pid for pid, command in _children(up.pid) if "server start" in command]
        up.kill()
        up.wait(timeout=30)
        wait_for(lambda: not _alive(server) and not listening(port), "the orphaned server to end", 30)
    finally:
        if up.poll() is None:
            up.kill()


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    """One PREFECT_HOME for the temporary servers of this module's `stoke run`s."""
    return str(migrated_home(tmp_path_factory, tmp_path_factory.mktemp("prefect-home")))


def _alive_now(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL", "Ctrl-C"])
def test_stoke_run_stopped_or_killed_mid_stage_leaves_no_process_behind(how, tmp_path, prefect_home):
    """`stoke run` stopped (SIGTERM or SIGINT sent to it alone, or a terminal's Ctrl-C: SIGINT to its process
    group) or killed (SIGKILL) during a stage: its temporary Prefect server, the stage program and what the
    stage started all end with it, and a stopped run says so in one line."""
    import psutil

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=prefect_home, STOKE_TEST_PIDS=str(tmp_path / "pids"))
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    with open(tmp_path / "stderr", "wb") as stderr:
        run = subprocess.Popen([sys.executable, "-m", "tests.flows.run_with_held_stage", "run", str(tmp_path / "photos"),
                                "--root", str(tmp_path / "root"), "--run-id", "held"],
                               stdout=subprocess.DEVNULL, stderr=stderr, env=env, start_new_session=True,
                               preexec_fn=_sigint_as_in_a_terminal)
    family = []
    try:
        wait_for(lambda: (tmp_path / "pids").exists(), "the stage to start", 300, process=run)
        stage, child = map(int, (tmp_path / "pids").read_text().split())
        family = psutil.Process(run.pid).children(recursive=True)
        commands = {p.pid: " ".join(p.cmdline()) for p in family}
        assert stage in commands and child in commands
        assert any("uvicorn" in command and "prefect.server" in command for command in commands.values()), commands
        if how == "Ctrl-C":
            os.killpg(run.pid, signal.SIGINT)
        else:
            os.kill(run.pid, signal.Signals[how])
        code = run.wait(timeout=120)
        wait_for(lambda: not any(map(_alive_now, family)), "every process `stoke run` started to end", 60)
    finally:
        if run.poll() is None:
            run.kill()
        for process in filter(_alive_now, family):
            process.kill()
    if how == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        said = (tmp_path / "stderr").read_text()
        assert code == 130 and "Traceback" not in said, said[-3000:]
        assert said.strip().splitlines()[-1] == "stoke run: stopped; run it again with --run-id held to resume"


def _sigint_as_in_a_terminal() -> None:
    """SIGINT at its default in the child, as a terminal starts `stoke run`: a suite started in the
    background by a shell inherits SIGINT ignored, and the child would inherit that too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_up_refuses_a_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([os.path.join(BIN, "stoke"), "up", "--source", str(tmp_path), "--root", str(tmp_path),
                               "--port", str(port)], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PREFECT_HOME": str(tmp_path / "home")})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"stoke up: error: port {port} on 127.0.0.1 is in use (another `stoke up` or Prefect server?); "
        "choose another with --port"]


AUTH = {"Authorization": "Basic " + base64.b64encode(b"stoke:s3cret").decode()}


def _get(url: str):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH), timeout=5) as response:
            return json.load(response)
    except OSError:
        return None


def _post(url: str, body: dict):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **AUTH})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.mark.parametrize("value", ["sqs://", "sqs://a/b", "https://sqs.us-east-1.amazonaws.com/123456789012/q",
                                   "pubsub://projects/p/topics/t", "pubsub://p/s", "gs://photos", "q"])
@pytest.mark.parametrize("command", ["up", "deploy"])
def test_up_and_deploy_refuse_notifications_that_name_no_queue(command, value, tmp_path, capsys):
    from flows import cli, work_pools

    argv = ["--source", "s3://photos/incoming", "--root", str(tmp_path), "--notifications", value]
    with pytest.raises(SystemExit) as exit:
        cli.main(["up", *argv]) if command == "up" else work_pools.main(argv)
    assert exit.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"stoke {command}: error: argument --notifications: {value!r}: expected sqs://QUEUE_NAME or "
                    "pubsub://projects/PROJECT/subscriptions/SUBSCRIPTION")
    assert list(tmp_path.iterdir()) == []


def test_notifications_spellings_that_name_a_queue():
    from flows.notifications import checked

    assert checked(" SQS://stoke-arrivals ") == "sqs://stoke-arrivals"
    assert checked("sqs://arrivals.fifo") == "sqs://arrivals.fifo"
    assert checked("PubSub://projects/p/subscriptions/s") == "pubsub://projects/p/subscriptions/s"
