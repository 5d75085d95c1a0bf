"""What stage programs print: names are escaped before they reach a terminal or a report."""
import json

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
    write_json(run.summary("ingest"), {"published": True, "span": 1, "counts": {"train": 1, "eval": 0, "dead_letter": 1},
                                       "new_sources": 2, "images_per_sec": 5.0,
                                       "dead_letters": [{"uri": f"/in/{EVIL}.jpg", "reason": "not an image",
                                                                         "size": 9, "version": "1"}]})
    markdown = write_report(run)["markdown"]
    assert "\x1b" not in markdown and "\u202e" not in markdown and "cat\\x1b[2J" in markdown
