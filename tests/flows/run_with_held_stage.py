"""`stoke ARGS...` with the preflight stage's program replaced by tests/flows/held_stage.py, which holds on
until it is stopped: for tests that stop `stoke run` mid-stage without training anything."""
import dataclasses
import sys

from components.contracts import stages

stages.STAGES = tuple(dataclasses.replace(s, program="tests.flows.held_stage") if s.name == "preflight" else s
                      for s in stages.STAGES)

from flows import cli  # noqa: E402 - the registry first

sys.exit(cli.main(sys.argv[1:]))
