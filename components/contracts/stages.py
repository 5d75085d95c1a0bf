"""The stage registry: every stage program of the pipeline, once, in the order the `train` flow runs them.

The CLI (`stoke <stage>`), the stage programs' flags, the flow's tasks, the report's sections, the timeouts
and the house-rules test all read this list, so none keeps its own. A new stage is one package under
components/ (a program: `python -m components.<name>`, printing its result model) and one entry here, listed
where it runs: the flow runs it at its place (`runs`), as a task of its own, and the report gives it a section
(its result's `in_words()` and warnings). A stage with settings also has its group in RunConfig
(run_config.py) and the flow's parameters. The report is no stage: it is the flow's last step, and the
`stoke report` tool, and reads every stage's result.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel

from components.contracts import config, results, summaries


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str  # the one name: command, package, flow task, settings group, timeout and result file
    program: str  # `python -m <program>`: what the CLI and the flow start
    summary: str  # one line for `stoke --help`
    settings: type[BaseModel] | None  # its group of the run configuration; None: a stage without settings
    result: type[results.Result]  # the JSON object its program prints last: ROOT/runs/<id>/<name>.json (layout.py)
    # What the program takes beside its group, by hand its flags too: run-wide settings of RunConfig and
    # facts of the run (run_config.RunFacts); those in `required` must be given. One given the run (`run_id`)
    # writes its result into the run folder itself, as its last act; the flow writes what the others print.
    inputs: tuple[str, ...] = ("root",)
    required: tuple[str, ...] = ("root",)
    # Where the flow runs it: "checks" before the skip decision, "training" after it, "blessed" only when the
    # gate blessed; a stage the flow has no task of its own for runs after those of its place.
    runs: Literal["checks", "training", "blessed"] = "checks"
    gpu: bool = False  # holds the machine's GPU slot while it runs (flows/gpu_slot.py); its task is tagged `gpu`
    retries: int = 1  # more tries, 30 s apart, after a failure another try may not meet (exit code 75, a signal)
    timeout: float = 30  # minutes its program may run: the default of its setting timeouts.<name> (run_config.py)


STAGES: tuple[Stage, ...] = (
    Stage("preflight", "components.preflight", "the machine before any GPU hour: SOURCE, disks, read speed, GPUs, "
          "/dev/shm, limits", config.PreflightConfig, summaries.PreflightSummary,
          inputs=("root", "source", "preset", "shard_cache"), timeout=10),
    Stage("ingest", "beam_jobs.ingest", "new images to a new span of GZIP TFRecords (Beam)",
          config.IngestConfig, summaries.IngestSummary,
          inputs=("source", "root", "arrived"), required=("source", "root"), retries=2, timeout=240),
    Stage("datacheck", "components.datacheck", "a span's statistics against the published history, and its labels "
          "against the served model: errors quarantine it", config.DataCheckConfig, summaries.DataCheckSummary,
          inputs=("root", "span", "model_name")),
    Stage("train", "components.train", "published spans to a candidate SavedModel",
          config.TrainConfig, results.TrainMetrics,
          inputs=("root", "run_id", "preset", "shard_cache", "model_name"), runs="training", gpu=True, retries=0,
          timeout=24 * 60),
    Stage("gate", "components.gate", "TFMA against thresholds and the served model: blessed or not, with reasons",
          config.GateConfig, results.GateResult,
          inputs=("root", "run_id", "model_name", "shard_cache"), required=("root", "run_id"), runs="training", gpu=True,
          timeout=120),
    Stage("push", "components.push", "a blessed candidate to a new version in the model repository",
          config.PushConfig, summaries.PushSummary,
          inputs=("root", "run_id", "model_name"), required=("root", "run_id"), runs="blessed"),
)


def stage(name: str) -> Stage:
    """The stage called `name`."""
    for candidate in STAGES:
        if name == candidate.name:
            return candidate
    raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in STAGES)}")
