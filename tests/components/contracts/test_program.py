"""What stage programs read and print: settings from a file with options over it; names escaped before
they reach a terminal or a report."""
import json
import os

import pytest

from components.common import program
from components.common.files import write_json
from components.contracts.layout import Root
from components.report.report import write_report
from tests.full_disk import small_disk

EVIL = "cat\x1b[2J\x1b[31m\nrm -rf ~\u202egpj.exe"


def test_control_and_format_characters_are_escaped_and_text_is_not():
    assert program.printable(EVIL) == "cat\\x1b[2J\\x1b[31m\\nrm -rf ~\\u202egpj.exe"
    assert program.printable({"k": ["Zoë 日本 tab-less"], "n": 3}) == {"k": ["Zoë 日本 tab-less"], "n": 3}


def test_a_program_prints_names_escaped_and_its_json_intact(capsys):
    summary = {"file": EVIL}
    assert program.main("stoke x", False, lambda: summary, lambda s: f"rejected {s['file']}") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and out.count("\n") == 1 and "\\x1b[2J" in out
    assert program.main("stoke x", True, lambda: summary, lambda s: "") == 0
    assert json.loads(capsys.readouterr().out) == summary


# A program whose work leaves a folder of its own and a child's file in the temporary folder, then ends as asked.
LEAVES = """
import errno, subprocess, sys, tempfile
from components.common import program

def work(then):
    def leaves():
        tempfile.mkdtemp()  # a library's folder, never removed
        subprocess.run([sys.executable, "-c", "import tempfile; tempfile.mkstemp()"], check=True)  # a child's file
        return then()
    return leaves

def beam_job():
    import apache_beam as beam

    with beam.Pipeline(runner="DirectRunner") as pipeline:
        _ = pipeline | beam.Create([1, 2]) | beam.Map(abs)
    return {}

def refused():
    raise OSError(errno.ENOSPC, "No space left on device", "/r/x")

def crashed():
    raise RuntimeError("a bug")

for then in sys.argv[1:]:
    print("exit", program.main("stoke x", True, work(globals()[then]), str, errors=(OSError,)))
"""


@pytest.mark.parametrize("ends", [["beam_job", "refused"], ["crashed"]])
def test_a_program_leaves_nothing_in_the_temporary_folder(tmp_path, ends):
    """What a program and the processes it starts put in the temporary folder goes as it ends, whether it did its
    work, refused it in one line or crashed. A Beam job on Beam's own DirectRunner leaves four folders there as it
    tries its PrismRunner first, as a job handed to any job service does."""
    import os
    import subprocess
    import sys

    given = tmp_path / "tmp"
    given.mkdir()
    done = subprocess.run([sys.executable, "-c", LEAVES, *ends], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(given)})
    assert [line for line in done.stdout.splitlines() if line.startswith("exit")] == \
        (["exit 0", "exit 1"] if ends[0] == "beam_job" else [])
    assert ("RuntimeError: a bug" in done.stderr) == (ends == ["crashed"]), done.stderr
    assert list(given.iterdir()) == []


def test_a_program_gives_the_temporary_folder_back_and_says_in_one_line_when_it_has_none(tmp_path, monkeypatch,
                                                                                        capsys):
    import os
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    seen = []
    assert program.main("stoke x", True, lambda: seen.append((os.environ["TMPDIR"], tempfile.gettempdir())) or {},
                        str) == 0
    assert seen[0][0] == seen[0][1] and os.path.dirname(seen[0][0]) == str(tmp_path)
    assert (os.environ["TMPDIR"], tempfile.gettempdir()) == (str(tmp_path), str(tmp_path))
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "file"))  # no folder can be made there
    assert program.main("stoke x", True, dict, str) == program.BAD_SETTINGS
    assert capsys.readouterr().err.splitlines()[-1] == (f"stoke x: error: the temporary folder {tmp_path / 'file'} "
                                                        "cannot be used: not a directory; set $TMPDIR to a folder "
                                                        "this user can write to")


def test_the_report_shows_dead_letter_names_escaped(tmp_path):
    run = Root(str(tmp_path)).run("r1")
    counts = {"train": 1, "eval": 0, "dead_letter": 1, "duplicates": 0}
    write_json(run.result("ingest"), {"published": True, "span": 1, "counts": counts,
                                       "new_sources": 2, "images_per_sec": 5.0,
                                       "dead_letters": [{"uri": f"/in/{EVIL}.jpg", "reason": "not an image",
                                                                         "size": 9, "version": "1"}]})
    markdown = write_report(run)["markdown"]
    assert "\x1b" not in markdown and "\u202e" not in markdown and "cat\\x1b[2J" in markdown


def test_a_stage_reads_the_run_configuration_and_the_options_given_win(tmp_path):
    settings = tmp_path / "config.json"
    write_json(str(settings), {"root": "/r", "train": {"epochs": 7, "seed": 1}, "gate": {"top_k": 3},
                               "shard_cache": {"dir": "/c", "max_gb": 5}})
    args = program.stage_arguments("train", ["--config", str(settings), "--seed", "2", "--shard-cache-max-gb", "9",
                                             "--run-id", "x"])
    config, facts = program.stage_config("train", args)
    assert (config.root, config.train.epochs, config.train.seed, facts.run_id) == ("/r", 7, 2, "x")
    assert (config.shard_cache.dir, config.shard_cache.max_gb, config.gate.top_k) == ("/c", 9.0, 3)
    assert config.train.network == "efficientnet_b0"  # the preset filled, once


def test_without_a_file_the_options_alone_are_the_settings_and_a_required_one_is_named(capsys):
    config, facts = program.stage_config("gate", program.stage_arguments("gate", ["--root", "/r", "--run-id", "x"]))
    assert (config.root, facts.run_id, config.gate.top_k) == ("/r", "x", 5)
    args = program.stage_arguments("gate", ["--root", "/r"])
    assert program.main("stoke gate", False, lambda: program.stage_config("gate", args), str) == program.BAD_SETTINGS
    assert capsys.readouterr().err.strip() == "stoke gate: error: --run-id: Field required"


def test_a_settings_file_with_a_key_no_stage_takes_is_refused(tmp_path, capsys):
    settings = tmp_path / "config.json"
    write_json(str(settings), {"root": "/r", "push": {"keep": 2, "epochs": 3}})
    args = program.stage_arguments("push", ["--config", str(settings), "--run-id", "x", "--json"])
    assert program.main("stoke push", True, lambda: program.stage_config("push", args), str) == program.BAD_SETTINGS
    assert capsys.readouterr().err.strip() == "stoke push: error: --epochs: no such setting"


def _client_error(code: str, status: int, message: str = "the store's words"):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "ListObjectsV2")


def _translated(code: str, status: int):
    """A ClientError as s3fs raises it: an OSError whose __cause__ it is."""
    from s3fs.errors import translate_boto_error

    try:
        raise translate_boto_error(_client_error(code, status))
    except OSError as error:
        return error


def _errors():
    """(error, transient) for the stores' and the system's exceptions, built from the installed libraries."""
    import errno

    import aiohttp
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
        ReadTimeoutError,
        SSLError,
    )
    from gcsfs.retry import HttpError
    from google.api_core import exceptions as api
    from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError

    return [
        (NoCredentialsError(), False), (PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"), False),
        (ProfileNotFound(profile="nope"), False), (SSLError(endpoint_url="https://s3", error="bad certificate"), False),
        *[(_client_error(code, status), False) for code, status in
          [("AccessDenied", 403), ("InvalidAccessKeyId", 403), ("SignatureDoesNotMatch", 403), ("NoSuchBucket", 404),
           ("403", 403), ("NoSuchKey", 404)]],
        *[(_client_error(code, status), True) for code, status in
          [("SlowDown", 503), ("Throttling", 400), ("RequestTimeout", 400), ("ServiceUnavailable", 503),
           ("InternalError", 500), ("503", 503)]],
        (_translated("AccessDenied", 403), False), (_translated("InvalidAccessKeyId", 403), False),
        (_translated("NoSuchBucket", 404), False), (_translated("SlowDown", 503), True),
        (_translated("InternalError", 500), True),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), True), (ConnectTimeoutError(endpoint_url="http://s3"), True),
        (ReadTimeoutError(endpoint_url="http://s3"), True),
        (DefaultCredentialsError("no credentials"), False), (RefreshError("invalid_grant"), False),
        (RefreshError("the token server is busy", retryable=True), True), (TransportError("reset"), True),
        (HttpError({"code": 401, "message": "Anonymous caller does not have storage.objects.list access"}), False),
        (HttpError({"code": 403, "message": "forbidden"}), False), (HttpError({"code": 429, "message": "slow down"}), True),
        (HttpError({"code": 503, "message": "unavailable"}), True), (api.ServiceUnavailable("down"), True),
        (api.TooManyRequests("slow down"), True), (api.Forbidden("no"), False), (api.NotFound("no bucket"), False),
        (aiohttp.ServerDisconnectedError(), True), (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (TimeoutError(), True), (OSError(errno.ETIMEDOUT, "timed out"), True),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/in"), False),
        (PermissionError(errno.EACCES, "Permission denied", "/in"), False), (ValueError("bad manifest"), False),
        (KeyError("a bug"), False),
    ]


@pytest.mark.parametrize("error,transient", _errors(), ids=lambda value: "" if isinstance(value, bool) else type(value).__name__)
def test_a_failure_is_transient_only_when_another_try_may_not_meet_it(error, transient):
    assert program.transient(error) is transient


def test_the_cause_decides_and_a_verdict_set_where_the_error_was_made_wins():
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    class StageFailed(Exception):
        pass

    try:
        try:
            raise EndpointConnectionError(endpoint_url="http://s3")
        except Exception as cause:
            raise StageFailed("the listing failed") from cause
    except StageFailed as error:
        assert program.transient(error)  # its cause is a connection that failed
    try:
        try:
            raise EndpointConnectionError(endpoint_url="http://s3")
        except Exception:
            raise StageFailed("bad input") from None  # said in its own words: the cause is not its
    except StageFailed as error:
        assert not program.transient(error)
    decided = StageFailed("a verdict")
    decided.transient = True
    decided.__cause__ = NoCredentialsError()
    assert program.transient(decided)


class Refused(Exception):
    pass


def test_a_program_exits_75_for_a_transient_failure_and_1_for_a_deterministic_one(capsys):
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    def failing(error):
        def work():
            raise error
        return work

    assert program.main("stoke x", True, failing(OSError(110, "Connection timed out")), str, errors=(OSError,)) == 75
    assert program.main("stoke x", True, failing(PermissionError(13, "Permission denied", "/in")), str,
                        errors=(OSError,)) == program.FAILED
    assert program.main("stoke x", True, failing(Refused("no")), str, errors=(Refused,)) == program.FAILED
    capsys.readouterr()
    # Not among the program's errors, and transient: still one line, and a retry.
    assert program.main("stoke x", True, failing(EndpointConnectionError(endpoint_url="http://s3")), str) == 75
    err = capsys.readouterr().err
    assert err == 'stoke x: error: EndpointConnectionError: Could not connect to the endpoint URL: "http://s3"\n'
    with pytest.raises(NoCredentialsError):  # not among them and not transient: a bug's traceback is wanted
        program.main("stoke x", True, failing(NoCredentialsError()), str)


def test_a_full_disk_behind_tensorflows_or_beams_error_is_the_programs_one_line(tmp_path, capsys):
    """No program lists TensorFlow's errors or Beam's among its own: TensorFlow says a full disk in its message
    (`{{function_node ...}} PATH; No space left on device [Op:...]`), Beam raises its worker's OSError as a
    RuntimeError while handling it. Either is one line, exit 1 (another try meets the same disk), not a traceback."""
    import apache_beam as beam
    import tensorflow as tf

    with small_disk(tmp_path / "disk") as disk:
        disk.fill()
        weights = os.path.join(disk.path, "root", "runs", "r1", "weights.bin")

        def tensorflow_job():
            tf.io.write_file(weights, b"x" * 100_000)

        assert program.main("stoke train", True, tensorflow_job, str) == program.FAILED
        captured = capsys.readouterr()
        line = f"{weights} cannot be written: no space left on device"
        assert captured.err == f"stoke train: error: {line}\n" and json.loads(captured.out) == {"error": line}

        def beam_job():
            with beam.Pipeline(runner="DirectRunner") as pipeline:
                _ = pipeline | beam.Create(["x" * 100_000]) | beam.io.WriteToText(os.path.join(disk.path, "out"))

        assert program.main("stoke gate", False, beam_job, str) == program.FAILED
        assert capsys.readouterr().err == "stoke gate: error: [Errno 28] No space left on device\n"


def test_progress_is_a_bar_on_a_terminal_and_a_line_each_in_a_log(capsys):
    """A stage program's progress events: on a terminal a bar, redrawn at each event and left done; anywhere
    else (a log, a pipe) a line each, as before; with --json, JSON lines on stdout."""
    import io

    from rich.console import Console

    from components.contracts.summaries import Progress

    events = [Progress(stage="ingest", done=done, total=40.0, unit="MB", seconds=seconds) for done, seconds in
              ((10.0, 10.0), (40.0, 20.0))]
    show = program.progress_printer(as_json=False, terminal=False)
    for event in events:
        show(event)
    assert capsys.readouterr().err.splitlines() == ["ingest: 10 of 40 MB after 10 s", "ingest: 40 of 40 MB after 20 s"]
    json_lines = program.progress_printer(as_json=True, terminal=True)
    json_lines(events[0])
    assert json.loads(capsys.readouterr().out)["done"] == 10.0
    assert isinstance(program.progress_printer(as_json=False, terminal=True), program.ProgressBar)
    screen = io.StringIO()
    bar = program.ProgressBar(Console(file=screen, force_terminal=True, width=100))
    for event in events:
        bar(event)
    bar.close()
    bar.close()  # a second close (the block's end after the program's) does nothing
    drawn = screen.getvalue()
    assert "10 of 40 MB after 10 s" in drawn and "40 of 40 MB after 20 s" in drawn and "━" in drawn
    assert capsys.readouterr() == ("", "")  # nothing on the program's own streams


def test_the_bar_draws_on_prefects_console_whose_theme_has_none_of_rich_s_own_styles():
    """`stoke run` draws the bar on the console Prefect's console handler prints the run's lines through
    (flows/reporting.py), whose theme lacks rich's progress styles."""
    import io

    from prefect.logging.handlers import PrefectConsoleHandler

    from components.contracts.summaries import Progress

    screen = io.StringIO()
    console = PrefectConsoleHandler(stream=screen).console
    bar = program.ProgressBar(console)
    bar(Progress(stage="train", done=2.0, total=8.0, unit="epochs", seconds=30.0))
    bar.close(finished=True)  # the stage ended well after its last event: the bar is left full
    assert "8 of 8 epochs after 30 s" in screen.getvalue()
