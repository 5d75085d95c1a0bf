"""Bad input is one line, at once, from `stoke ingest`, `stoke preflight` and `stoke run`: no traceback,
no retry. A bucket's refusal names the store, the bucket and what to set (moto's S3 on 127.0.0.1 with its
IAM checks on, credentials removed from the environment); a missing or unreadable folder, an empty one,
one of sidecars and a manifest without its columns say so. Real processes against the session's
Prefect test server; the engine's traceback stays in the run's log in the API."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from tests.waiting import wait_for

BIN = os.path.dirname(sys.executable)
NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
                  "AWS_PROFILE": None, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                  "AWS_EC2_METADATA_DISABLED": "true"}  # no ~/.aws, no instance metadata service
BUCKET = "t-one-line-errors"
# Root writes through file permissions: the permission-denied case runs its process without that power.
WITHOUT_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []


@dataclass
class Case:
    source: str
    says: list[str]  # what the error line holds, from every entry point
    env: dict = field(default_factory=dict)  # None removes a variable
    iam: bool = False  # moto checks signatures and permissions (its IAM) while this case runs
    prefix: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def store(s3_endpoint):
    """A bucket with one image in a class folder and a good manifest, and moto's IAM user without permissions."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="photos/cat/0.png", Body=b"an image by its name")
    s3.put_object(Bucket=BUCKET, Key="photos/m.csv", Body=b"uri,label\ncat/0.png,cat\n")
    iam = boto3.client("iam", endpoint_url=s3_endpoint)
    iam.create_user(UserName="stoke-no-permissions")
    key = iam.create_access_key(UserName="stoke-no-permissions")["AccessKey"]
    return {"endpoint": s3_endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}


def make(name: str, tmp_path, store) -> Case:
    """The bad input `name`, made for real under tmp_path or in the bucket."""
    photos, key = f"s3://{BUCKET}/photos", store["key"]
    if name == "s3 without credentials":
        return Case(photos, [f"no S3 credentials for bucket {BUCKET}", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"], NO_CREDENTIALS)
    if name == "s3 with an unknown key":
        return Case(photos, [f"S3 refused the credentials for bucket {BUCKET} (InvalidAccessKeyId", "AWS_SECRET_ACCESS_KEY"],
                    {"AWS_ACCESS_KEY_ID": "AKIAUNKNOWN000000000"}, iam=True)
    if name == "s3 with a wrong secret":
        return Case(f"{photos}/m.csv", [f"S3 refused the credentials for bucket {BUCKET} (SignatureDoesNotMatch"],
                    {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}, iam=True)
    if name == "s3 without permission":
        return Case(photos, [f"S3 denied access to bucket {BUCKET} (AccessDenied", "s3:ListBucket"],
                    {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": store["secret"]}, iam=True)
    if name == "a bucket that does not exist":
        return Case("s3://no-such-bucket/photos", ["no-such-bucket", "does not exist"])
    folder = tmp_path / "photos"
    if name == "a mistyped local path":
        return Case(str(tmp_path / "photso"), [f"{tmp_path / 'photso'} does not exist"])
    if name == "a folder it may not read":
        (folder / "cat").mkdir(parents=True)
        (folder / "cat" / "0.png").write_bytes(b"x")
        folder.chmod(0)
        return Case(str(folder), [f"{folder} cannot be read: permission denied"], prefix=WITHOUT_OVERRIDE)
    if name == "a folder inside one it may not enter":  # where `exists` would say "does not exist"
        (tmp_path / "locked" / "photos" / "cat").mkdir(parents=True)
        (tmp_path / "locked").chmod(0)
        inner = tmp_path / "locked" / "photos"
        return Case(str(inner), [f"{inner} cannot be read: permission denied"], prefix=WITHOUT_OVERRIDE)
    folder.mkdir()
    if name == "an empty folder":
        return Case(str(folder), [f"SOURCE holds no images: {folder} has no image files"])
    if name == "a folder of sidecars":
        for sidecar in ("cat/notes.txt", "cat/0.json", "cat/.0.png", ".cache/1.png"):
            (folder / sidecar).parent.mkdir(exist_ok=True)
            (folder / sidecar).write_text("not an image")
        return Case(str(folder), [f"SOURCE holds no images: {folder}", "sidecars"])
    manifests = {"a CSV with path,label": ("path,label\nbad/path,cat\n", ["its header path,label has no column uri"]),
                 "a CSV with uri,class": ("uri,class\ncat/0.png,cat\n", ["its header uri,class has no column label"]),
                 "an empty CSV": ("", ["SOURCE holds no images: manifest", "has no rows"])}
    text, says = manifests[name]
    (folder / "m.csv").write_text(text)
    return Case(str(folder / "m.csv"), [*says, "uri,label[,split]"])


CASES = ["s3 without credentials", "s3 with an unknown key", "s3 with a wrong secret", "s3 without permission",
         "a bucket that does not exist", "a mistyped local path", "a folder it may not read",
         "a folder inside one it may not enter", "an empty folder",
         "a folder of sidecars", "a CSV with path,label", "a CSV with uri,class", "an empty CSV"]


def stoke(case: Case, store, *argv: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env, **case.env}
    environment = {name: value for name, value in environment.items() if value is not None}
    if case.prefix and not shutil.which(case.prefix[0]):
        pytest.skip(f"{case.prefix[0]} is not installed: tests run as root, which reads any folder")
    with _iam(store["endpoint"], case.iam):
        return subprocess.run([*case.prefix, os.path.join(BIN, "stoke"), *argv], capture_output=True, text=True,
                              env=environment, timeout=600)


@contextmanager
def _iam(endpoint: str, on: bool):
    """moto checks every request's credentials and permissions in the block (its IAM), as AWS does."""
    import urllib.request

    def auth(count: bytes) -> None:
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", count, {"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).close()

    if on:
        auth(b"0")
    try:
        yield
    finally:
        if on:
            auth(b"inf")


def one_line(done: subprocess.CompletedProcess, prefix: str, case: Case) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith(prefix), done.stderr
    assert all(fragment in lines[0] for fragment in case.says), lines[0]
    return lines[0]


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line_from_the_stage_programs(name, tmp_path, store):
    case, root = make(name, tmp_path, store), str(tmp_path / "root")
    line = one_line(stoke(case, store, "ingest", case.source, "--root", root), "stoke ingest: error: ", case)
    assert not os.path.exists(os.path.join(root, "data", "spans", "span-00001"))
    one_line(stoke(case, store, "preflight", "--source", case.source, "--root", root), "stoke preflight: source failed: ",
             case)
    if name in ("s3 without credentials", "s3 with an unknown key", "s3 with a wrong secret"):
        assert "AWS_ENDPOINT_URL" in line  # where a MinIO user names the store the credentials are for


# `stoke run` for each way through the flow (a store's refusal, a local path, a manifest): preflight stops
# the run on them; without preflight, ingest fails once, and its own line is the run's last. Every case
# goes through both programs above; a run costs seconds of Prefect's own, so not every case is run again.
THROUGH_PREFLIGHT = ["s3 without credentials", "a mistyped local path", "a CSV with path,label"]
THROUGH_INGEST = ["s3 without credentials", "a folder of sidecars", "a CSV with uri,class"]


@pytest.mark.parametrize("name,preflight", [(n, True) for n in THROUGH_PREFLIGHT] + [(n, False) for n in THROUGH_INGEST])
def test_bad_input_is_one_line_from_stoke_run_without_a_retry(name, preflight, tmp_path, store):
    from prefect.settings import PREFECT_API_URL

    case, root, stage = make(name, tmp_path, store), str(tmp_path / "root"), "preflight" if preflight else "ingest"
    done = stoke(case, store, "run", case.source, "--root", root, "--preset", "demo", "--run-id", "bad-input",
                 "--json", *([] if preflight else ["--no-preflight"]), PREFECT_API_URL=PREFECT_API_URL.value())
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith(f"stoke run: error: {stage}: ") and all(f in lines[-1] for f in case.says), lines[-1]
    # Said once: not by the stage's own line, the failed check's row, the task's and the flow's states again.
    assert sum(case.says[0] in line for line in lines) == 1, done.stderr
    assert sum(f"{stage}: -m " in line for line in lines) == 1 and "Retry" not in done.stderr  # it ran once
    if preflight:
        assert not any("ingest: -m " in line for line in lines)  # stopped before ingest
    assert len(lines) < 20, done.stderr  # the run's own lines, not 300 of tracebacks
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "failed" and summary["run_id"] == "bad-input"
    if name == "a CSV with uri,class":
        assert_the_traceback_is_in_the_runs_log(root)


def assert_the_traceback_is_in_the_runs_log(root: str) -> None:
    """The terminal got the one line; the run's log in the Prefect API keeps the engine's traceback."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        (run,) = [r for r in client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=20)
                  if r.parameters.get("root") == root]

        def traceback_logged():
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            return any("Traceback (most recent call last)" in log.message and "StageError" in log.message for log in logs)

        wait_for(traceback_logged, "the run's log to hold the traceback", 30)


def test_a_temporary_server_that_does_not_answer_is_one_line_naming_its_log(tmp_path):
    """`stoke run` without PREFECT_API_URL starts Prefect's temporary server; one that does not answer in
    time (here at once: the setting is 0) is one line naming its log, before anything runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0")
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", str(tmp_path / "photos"), "--root", str(tmp_path / "root"),
                           "--json"], capture_output=True, text=True, env=env, timeout=300)
    log = tmp_path / "home" / "stoke-ephemeral-server.log"
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"stoke run: error: the temporary Prefect server did not answer within 0 s; see {log} (raise "
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or start one with `prefect server start` and set PREFECT_API_URL)"]
    assert log.exists() and not (tmp_path / "root").exists()


def test_stoke_run_gives_its_temporary_server_longer_than_prefects_default():
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        Settings,
        get_current_settings,
        temporary_settings,
    )

    from flows.commands import EPHEMERAL_START_SECONDS, startup_timeout

    prefects = Settings().server.ephemeral.startup_timeout_seconds  # 20 s: less than a loaded machine needs
    assert startup_timeout(Settings()) == EPHEMERAL_START_SECONDS >= 6 * prefects
    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 600}):  # a user's own wins
        assert startup_timeout(get_current_settings()) == 600


def test_a_failed_runs_last_lines_say_its_cause_once():
    """Without --json, `stoke run` ends with the error line, then the run and its report: the report's
    message ("The run failed: " and the error) is not said again."""
    from flows.commands import _describe

    failed = {"run_id": "r", "status": "failed", "message": "The run failed: ingest failed (exit code 1): no images",
              "report_md": "/root/runs/r/report.md"}
    assert _describe(failed) == "r: failed\nreport: /root/runs/r/report.md"
    pushed = {**failed, "status": "pushed", "message": "Blessed and pushed as version 3."}
    assert _describe(pushed) == "r: pushed: Blessed and pushed as version 3.\nreport: /root/runs/r/report.md"
