"""File names with terminal escapes, newlines, bells and bidirectional overrides are escaped at every
exit to a terminal or a log: a program's error line and progress, the run loggers of the flows
(every message, whoever logs it), StageError messages, and `stoke run`'s last line."""
from __future__ import annotations

import json
import logging
import types

import pytest

from beam_jobs import ingest
from components.common import program
from flows import cli, programs, watch_bucket  # noqa: F401 - importing them installs the escaping

HOSTILE = ["esc\x1b[2Jname", "bell\x07name", "new\nline", "rtl\u202eexe.jpg", "sep\u2028line"]


def _clean(text: str) -> bool:
    return not any(ch in text for ch in "\x1b\x07\u202e\u2028") and text.count("\n") <= 1


@pytest.mark.parametrize("name", HOSTILE)
def test_the_ingest_error_line_escapes_the_source_name(tmp_path, capsys, name):
    code = ingest.run([str(tmp_path / name), "--root", str(tmp_path / "root"), "--json"])
    captured = capsys.readouterr()
    assert code == 1 and _clean(captured.err.rstrip("\n")) and captured.err.count("\n") == 1
    assert json.loads(captured.out.strip().splitlines()[-1])["error"]  # JSON escapes by itself


@pytest.mark.parametrize("name", HOSTILE)
def test_progress_lines_for_people_are_escaped(capsys, name):
    event = types.SimpleNamespace(describe=lambda: f"reading {name}")  # describe() of a Progress event
    program.progress_printer(False)(event)
    assert _clean(capsys.readouterr().err.rstrip("\n"))


@pytest.mark.parametrize("logger_name", ["prefect.flow_runs", "prefect.task_runs"])
@pytest.mark.parametrize("name", HOSTILE)
def test_every_message_of_the_run_loggers_is_escaped(caplog, logger_name, name):
    with caplog.at_level(logging.INFO, logger=logger_name):
        logging.getLogger(logger_name).info("run %s: %s -> %s", "r1", name, "root")
        logging.getLogger(logger_name).warning(f"held back {name}")
    assert [r for r in caplog.records if r.name == logger_name]
    assert all(_clean(r.getMessage()) for r in caplog.records)


@pytest.mark.parametrize("name", HOSTILE)
def test_stage_errors_are_escaped(name):
    assert _clean(str(programs.StageError(f"ingest failed (exit code 1): {name} does not exist")))


@pytest.mark.parametrize("name", HOSTILE)
def test_stoke_runs_last_line_is_escaped(tmp_path, capsys, monkeypatch, name):
    import flows.pipeline

    failed = types.SimpleNamespace(is_completed=lambda: False, message=f"{name} is not a folder", name="Failed")
    monkeypatch.setattr(flows.pipeline, "pipeline", lambda **kwargs: failed)
    (tmp_path / "images").mkdir()
    assert cli.main(["run", str(tmp_path / "images"), "--root", str(tmp_path / "root")]) == 1
    captured = capsys.readouterr()
    assert _clean(captured.err.rstrip("\n")) and all(_clean(line) for line in captured.out.splitlines())
    assert "\\x1b" in captured.err or "\\x07" in captured.err or "\\n" in captured.err or "\\u" in captured.err
