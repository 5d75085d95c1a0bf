"""What stage programs read and print: settings from a file with options over it; names escaped before
they reach a terminal or a report."""
import json

import pytest
from pydantic import ValidationError

from components.common.files import write_json
from components.contracts import program
from components.contracts.layout import Root
from components.report.report import write_report

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


def test_the_report_shows_dead_letter_names_escaped(tmp_path):
    run = Root(str(tmp_path)).run("r1")
    counts = {"train": 1, "eval": 0, "dead_letter": 1, "duplicates": 0}
    write_json(run.summary("ingest"), {"published": True, "span": 1, "counts": counts,
                                       "new_sources": 2, "images_per_sec": 5.0,
                                       "dead_letters": [{"uri": f"/in/{EVIL}.jpg", "reason": "not an image",
                                                                         "size": 9, "version": "1"}]})
    markdown = write_report(run)["markdown"]
    assert "\x1b" not in markdown and "\u202e" not in markdown and "cat\\x1b[2J" in markdown


def test_a_stage_reads_its_settings_file_and_the_options_given_win(tmp_path):
    settings = tmp_path / "train.json"
    write_json(str(settings), {"root": "/r", "epochs": 7, "seed": 1, "shard_cache": {"dir": "/c", "max_gb": 5}})
    args = program.stage_arguments("train", ["--config", str(settings), "--seed", "2", "--shard-cache-max-gb", "9"])
    config = program.stage_settings("train", args)
    assert (config.root, config.epochs, config.seed) == ("/r", 7, 2)
    assert (config.shard_cache.dir, config.shard_cache.max_gb) == ("/c", 9.0)


def test_without_a_file_the_options_alone_are_the_settings_and_a_required_one_is_named():
    config = program.stage_settings("gate", program.stage_arguments("gate", ["--root", "/r", "--run-id", "x"]))
    assert (config.root, config.run_id, config.top_k) == ("/r", "x", 5)
    with pytest.raises(ValidationError) as missing:
        program.stage_settings("gate", program.stage_arguments("gate", ["--root", "/r"]))
    assert program.settings_message(missing.value) == "--run-id: Field required"


def test_a_settings_file_with_a_key_the_stage_does_not_take_is_refused(tmp_path, capsys):
    settings = tmp_path / "push.json"
    write_json(str(settings), {"root": "/r", "run_id": "x", "epochs": 3})
    args = program.stage_arguments("push", ["--config", str(settings), "--json"])
    assert program.main("stoke push", True, lambda: program.stage_settings("push", args), str) == program.BAD_SETTINGS
    assert capsys.readouterr().err.strip() == "stoke push: error: --epochs: no such setting"
