"""A new stage is its package plus one registry entry: written here in a temporary folder (a program, its
result, an entry that holds the GPU slot and has no settings), it is a command of `stoke`, the flow runs it
at its place (after the data check, before the decision to skip) as a task of its own, and the report gives
it a section: its result in one line, and its warnings."""
from __future__ import annotations

import importlib
import os
import sys
import textwrap

import prefect
import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from components.common.files import read_json
from components.contracts import stages
from components.contracts.layout import Root
from flows import cli
from flows.pipeline import GPU_TAG, pipeline
from tests.beam_jobs import images
from tests.flows.conftest import TINY_BEAM

PACKAGE = '''
"""The census stage: the spans under ROOT, as the data check left them."""
import logging

from components.contracts.results import Result
from components.contracts.stages import Stage


class Census(Result):
    """The spans under ROOT and what the data check made of them."""

    published: list[int]
    let_in: list[int]
    unchecked: list[int]

    def in_words(self) -> str:
        return f"{len(self.published)} published, {len(self.let_in)} let in by the data check"

    def log_lines(self):
        return [(logging.WARNING, f"census: span {n} is not let in") for n in self.published if n not in self.let_in]


STAGE = Stage("census", "census", "the spans under ROOT, as the data check left them", None, Census,
              inputs=("root", "run_id"), required=("root", "run_id"), runs="checks", gpu=True, retries=0, timeout=5)
'''

PROGRAM = '''
"""`python -m census --config FILE --run-id ID --json`."""
import sys

from components.contracts import stages
from census import STAGE

# Its entry, as the registry would list it; the flow's own process was given the same one.
stages.STAGES = (*stages.STAGES, STAGE)

from components.common import program  # noqa: E402
from components.common.files import write_json  # noqa: E402
from components.common.spans import Spans  # noqa: E402
from components.contracts.layout import Root  # noqa: E402
from census import Census  # noqa: E402

args = program.stage_arguments("census")


def work():
    config, facts = program.stage_config("census", args)
    spans = Spans(config.root)
    published = spans.published()
    result = Census(published=published, let_in=[n for n in published if spans.check_record(n).trusted],
                    unchecked=spans.unchecked())
    write_json(Root(config.root).run(facts.run_id).result("census"), result.to_json())
    return result


sys.exit(program.main("stoke census", args.json, work, describe=str))
'''


@pytest.fixture
def census(tmp_path, monkeypatch):
    """The census stage's package in a folder of its own, importable here and by the programs the flow
    starts, and its entry in the registry after the stages that run with the checks."""
    package = tmp_path / "stages" / "census"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    (package / "__main__.py").write_text(textwrap.dedent(PROGRAM))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")])))
    monkeypatch.delitem(sys.modules, "census", raising=False)
    entry = importlib.import_module("census").STAGE
    last_check = max(i for i, s in enumerate(stages.STAGES) if s.runs == "checks")
    monkeypatch.setattr(stages, "STAGES", (*stages.STAGES[:last_check + 1], entry, *stages.STAGES[last_check + 1:]))
    return entry


def test_a_new_stage_is_a_command_a_task_at_its_place_and_a_section_of_the_report(census, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "the spans under ROOT, as the data check left them" in capsys.readouterr().out

    source, root = tmp_path / "source", str(tmp_path / "root")
    for label in ("cat", "dog"):  # one picture in other bytes: the data check quarantines the span
        (source / label).mkdir(parents=True)
        for seed in range(6):
            (source / label / f"{seed}.png").write_bytes(images.rgb_png(seed=seed + (10 if label == "dog" else 0)))
    state = pipeline(source=str(source), root=root, preflight=None, beam_args=TINY_BEAM, run_id="census",
                     return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["status"] == "skipped" and "no span the data check let in" in summary["message"]

    run = Root(root).run("census")
    # After the data check (span 1 is checked), before the decision to skip (a skipped run ran it).
    assert read_json(run.result("census")) == {"published": [1], "let_in": [], "unchecked": []}
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(
            any_=[state.state_details.flow_run_id])))
    (task,) = [t for t in tasks if t.name.rsplit("-", 1)[0] == "census"]
    assert task.state.is_completed() and GPU_TAG in task.tags

    report = read_json(run.report_json)
    assert report["stages"] == ["ingest", "datacheck", "census"]
    assert report["sections"] == {"census": {"summary": "1 published, 0 let in by the data check",
                                                 "warnings": ["census: span 1 is not let in"]}}
    markdown = open(run.report_md).read()
    assert "## Census\n\n1 published, 0 let in by the data check\n\n- warning: census: span 1 is not let in\n" in markdown
    assert markdown.index("## Ingest") < markdown.index("## Census")  # at its place in the flow, as listed
    assert summary["sections"] == report["sections"]


def test_the_registry_s_other_stages_run_at_their_place_in_its_order_and_the_flow_s_own_once(monkeypatch):
    from components.contracts.results import Result
    from flows import pipeline as flow

    added = [stages.Stage(name, "nowhere", "a stand-in", None, Result, runs=place)
             for name, place in (("a", "blessed"), ("b", "training"), ("c", "blessed"), ("d", "checks"))]
    monkeypatch.setattr(stages, "STAGES", (*stages.STAGES, *added))
    ran = []
    monkeypatch.setattr(flow, "run_program", lambda of, config, run: ran.append(of.name))

    @prefect.flow
    def places():
        for place in ("checks", "training", "blessed"):
            flow.run_added(place, None, None)

    places()
    assert ran == ["d", "b", "a", "c"]
