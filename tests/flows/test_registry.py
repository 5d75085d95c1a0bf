"""The stage registry is the one list of stages: a stage added there is a command whose flags are its
group's and the inputs the registry names, a group of the run configuration with a timeout, and a section
of the report."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from components.common import program
from components.contracts import lineage, stages
from components.contracts.config import PushConfig
from components.contracts.layout import Root
from components.contracts.run_config import RunConfig, Timeouts
from flows import cli
from flows.pipeline import pipeline

DUMMY = stages.Stage("dummy", "tests.flows.stage_program", "a stand-in stage", PushConfig, lineage.Pushed,
                     inputs=("root", "run_id"), required=("root", "run_id"))


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


def test_a_registered_stage_program_takes_its_group_and_the_inputs_the_registry_names(with_dummy):
    options = {action.dest for action in program.stage_parser("dummy")._actions} - {"help", "json", "config"}
    assert options == {f"dummy.{name}" for name in PushConfig.model_fields} | {"root", f"{program.FACTS}.run_id"}


def test_a_registered_stage_is_a_section_of_the_report(with_dummy, tmp_path):
    from components.common.files import write_json
    from components.report.report import build_report

    run = Root(str(tmp_path)).run("r")
    write_json(run.result("dummy"), {"version": 3, "model_uri": "/m/3", "pushed_at": "2026-12-01T00:00:00Z"})
    assert build_report(run).stages == ["dummy"]


def test_every_stage_is_a_group_of_the_run_configuration_with_a_timeout():
    groups = [name for name in RunConfig.model_fields if name in {s.name for s in stages.STAGES}]
    assert groups == [s.name for s in stages.STAGES]
    for s in stages.STAGES:
        assert RunConfig.model_fields[s.name].annotation in (s.settings, s.settings | None), s.name
        assert Timeouts.model_fields[s.name].default > 0, s.name


def test_the_flow_takes_the_run_configuration_why_the_run_started_and_the_networks_its_deployment_allows():
    parameters = inspect.signature(pipeline.fn).parameters
    assert list(parameters) == [*RunConfig.model_fields, "skip_unchanged", "run_id", "arrived", "networks"]
    for name, field in RunConfig.model_fields.items():
        default = parameters[name].default
        required = field.is_required() or name == "source"  # optional for a stage by hand; the flow ingests it
        assert (default is inspect.Parameter.empty) == required, name
        if not required:
            assert default == field.default, name


def test_stage_names_are_unique_and_an_unknown_one_is_named():
    names = [s.name for s in stages.STAGES]
    assert len(names) == len(set(names))
    with pytest.raises(KeyError, match="no stage 'nope'"):
        stages.stage("nope")


def test_a_stage_entry_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        stages.STAGES[0].name = "other"
