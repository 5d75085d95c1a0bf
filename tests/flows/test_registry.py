"""The stage registry is the one list of stages: a stage added there (and nowhere else) is a
command, a parameter group, a timeout and a section of the report."""
from __future__ import annotations

import dataclasses

import pytest

from components.contracts import results, stages
from components.contracts.config import PushConfig
from components.contracts.layout import Root
from flows import cli
from flows.parameters import SETTINGS, settings_model, timeouts_model

DUMMY = stages.Stage("dummy", "tests.flows.stage_program", "a stand-in stage", PushConfig, results.Pushed, 7)


@pytest.fixture
def with_dummy(monkeypatch):
    monkeypatch.setattr(stages, "STAGES", (*stages.STAGES, DUMMY))
    return DUMMY


def test_a_registered_stage_is_a_command_of_its_own(with_dummy, tmp_path, capfd):
    assert cli.main(["dummy", "ok", str(tmp_path / "pid")]) == 0
    assert '"mode": "ok"' in capfd.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "a stand-in stage" in capfd.readouterr().out


def test_a_registered_stage_gets_a_parameter_group_and_a_timeout(with_dummy):
    group = settings_model(with_dummy)
    assert set(group.model_fields) == set(PushConfig.model_fields) - {"root", "run_id", "model_name"}
    assert timeouts_model(stages.STAGES)().dummy == 7


def test_a_registered_stage_is_a_section_of_the_report(with_dummy, tmp_path):
    from components.common.files import write_json
    from components.report.report import build_report

    run = Root(str(tmp_path)).run("r")
    write_json(run.summary("dummy"), {"version": 3, "model_uri": "/m/3", "pushed_at": "2026-12-01T00:00:00Z"})
    assert build_report(run).stages == ["dummy"]


def test_every_flow_parameter_group_is_a_stage_with_settings():
    assert list(SETTINGS) == [s.name for s in stages.STAGES if s.settings is not None]


def test_old_names_find_their_stage_and_stage_names_are_unique():
    assert stages.stage("validate").name == stages.stage("validation").name == "gate"
    assert stages.stage("doctor").name == "preflight"
    names = [n for s in stages.STAGES for n in (s.name, *s.aliases)]
    assert len(names) == len(set(names))
    with pytest.raises(KeyError, match="no stage 'nope'"):
        stages.stage("nope")


def test_a_stage_entry_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        stages.STAGES[0].name = "other"
