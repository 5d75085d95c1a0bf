"""A password and a signature in SOURCE, signatures of a manifest's own rows and the deployment's Beam options
(a runner's credentials) are used and kept out of everything else: `stoke run` over a manifest and images that
a web server on 127.0.0.1 serves behind basic auth, then every byte under ROOT (shards opened), everything
printed, everything Prefect keeps of the run, every byte of Prefect's database and every command line seen
while it ran are searched for them."""
from __future__ import annotations

import datetime
import json
import os
import shutil

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterStartTime, LogFilter, LogFilterFlowRunId
from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

from components.common.files import read_json
from components.contracts.beam_options import BEAM_ARGS_ENV
from components.contracts.layout import Root
from components.contracts.secrets import SOURCE_ENV
from flows import cli
from flows.demo import write_digits
from tests.credentials import PASSWORD, TOKEN, USER, basic_auth_server, command_lines, holding, shows
from tests.flows.conftest import FIRST_RUN_CONFIG

# Rows signed on their own, under names no list of credential names holds (a CDN's HMAC, imgix, Akamai), and a
# token in a fragment; the server serves a file whatever its query says.
ROW_SIGNATURES = [f"?hmac={TOKEN}h", f"?s={TOKEN}s", f"?hdnts=exp=9~acl=*~hmac={TOKEN}a", f"#access_token={TOKEN}f", ""]


def photos_site(folder) -> str:
    """photos/manifest.csv naming 20 digits by relative paths, most with a signature of their own, a file that
    is not there (a dead letter) and a copy of a `zero` labelled `one` (a label conflict: the data check holds
    the span back, so the run ends before training)."""
    site, photos = str(folder / "site"), folder / "site" / "photos"
    write_digits(str(photos / "img"), limit=20)
    files = [f"img/{label}/{name}" for label in sorted(os.listdir(photos / "img"))
             for name in sorted(os.listdir(photos / "img" / label))]
    rows = ["uri,label"] + [f"{file}{ROW_SIGNATURES[i % len(ROW_SIGNATURES)]},{file.split('/')[1]}"
                            for i, file in enumerate(files)]
    zero = photos / "img" / "zero" / sorted(os.listdir(photos / "img" / "zero"))[0]
    (photos / "copies").mkdir()
    shutil.copy(zero, photos / "copies" / "twin.png")
    rows += ["copies/twin.png,one", "img/missing.png,zero"]
    (photos / "manifest.csv").write_text("\n".join(rows) + "\n")
    return site


def test_a_password_in_source_reads_it_and_is_in_nothing_a_run_leaves(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv(SOURCE_ENV, "")  # `stoke run` sets it in this process: put back afterwards
    # As `stoke up --beam-args-file` sets them: a runner's credentials, one of them as two tokens.
    monkeypatch.setenv(BEAM_ARGS_ENV, f"--s3_access_key_id=AKID{TOKEN} --s3_secret_access_key={TOKEN}k "
                                      f"--s3_session_token {TOKEN}t")
    root, config = str(tmp_path / "root"), tmp_path / "run.yaml"
    config.write_text(FIRST_RUN_CONFIG.replace("{sample_mb: 4}", "{sample_mb: 1}"))
    started = datetime.datetime.now(datetime.UTC)
    with basic_auth_server(photos_site(tmp_path)) as port, command_lines() as seen:
        source = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/photos/manifest.csv?hmac={TOKEN}q"
        code = cli.main(["run", source, "--root", root, "--config", str(config), "--run-id", "secret", "--json"])
    printed = capfd.readouterr()

    assert code == 0, printed.err
    summary = json.loads(printed.out.strip().splitlines()[-1])
    assert summary["status"] == "skipped" and "data check" in summary["message"], summary
    manifest = read_json(Root(root).manifest(1))
    counts = manifest["counts"]  # every image was read, through the password: 20 records, the twin a copy of one
    assert (counts["train"] + counts["eval"], counts["duplicates"], counts["dead_letter"]) == (20, 1, 2), counts
    assert manifest["source"] == f"http://{USER}:***@127.0.0.1:{port}/photos/manifest.csv"
    assert f"http://{USER}:***@127.0.0.1:{port}/photos/img/missing.png" in \
        open(Root(root).dead_letter(1)).read()
    run = Root(root).run("secret")
    assert read_json(run.config)["source"] == f"http://{USER}:***@127.0.0.1:{port}/photos/manifest.csv"  # what
    # preflight and ingest read, taking the password back from STOKE_SOURCE
    assert not os.path.exists(os.path.join(run.uri, "config"))
    assert holding(root) == []
    assert f"http://{USER}:***@127.0.0.1:{port}/photos/img/zero/" in json.dumps(manifest["sources"])
    assert not shows(printed.out + printed.err)
    assert not shows(prefect_records(started))
    assert holding(prefect_database()) == []
    assert any(b"beam_jobs.ingest" in line for line in seen)  # ingest ran while the process list was watched
    assert not [line for line in seen if shows(line)]


def prefect_database() -> str:
    """The folder of the Prefect test server's SQLite database (its -wal and -shm files beside it)."""
    return os.path.dirname(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().partition(":///")[2])


def prefect_records(since: datetime.datetime) -> str:
    """Everything Prefect's API keeps of the flow runs started since `since`: parameters, states, task runs, logs, artifacts."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)))
        ids = [r.id for r in runs]
        assert runs and any(r.parameters.get("root") for r in runs)
        where = FlowRunFilter(id=FlowRunFilterId(any_=ids))
        records = [r.model_dump(mode="json") for r in runs]
        records += [t.model_dump(mode="json") for t in client.read_task_runs(flow_run_filter=where)]
        records += [a.model_dump(mode="json") for a in client.read_artifacts(flow_run_filter=where)]
        records += [log.model_dump(mode="json") for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))]
    return json.dumps(records)


@pytest.mark.parametrize("password", [PASSWORD, f"2024;{TOKEN}", f"1234,{TOKEN}", f"12){TOKEN}", f"99]{TOKEN}",
                                      f"123'{TOKEN}", f"1234 {TOKEN}"])
def test_the_configuration_shown_holds_source_without_its_password(password, tmp_path, capsys):
    source = f"https://{USER}:{password}@127.0.0.1:9/photos/manifest.csv?pw={TOKEN}"
    for argv in ([], ["--json"]):
        assert cli.main(["config", "show", source, "--root", str(tmp_path), *argv]) == 0
    printed = capsys.readouterr()
    # YAML, then JSON: SOURCE as config.json records it, without its password and query
    assert printed.out.count(f'"https://{USER}:***@127.0.0.1:9/photos/manifest.csv"') == 2, printed.out
    assert not shows(printed.out + printed.err)
