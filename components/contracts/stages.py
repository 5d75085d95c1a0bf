"""The stage registry: every stage program of the pipeline, once, in the order the `train` flow runs them.

The CLI (`stoke <stage>`), the stage programs' flags, the flow's tasks, the report's sections and the
house-rules test all read this list, so none keeps its own. A new stage is one package under components/
(a program: `python -m components.<name>`), one entry here, its group and timeout in RunConfig
(run_config.py), and the line in flows/pipeline.py that says where it runs.
"""
from __future__ import annotations

import dataclasses

from pydantic import BaseModel

from components.contracts import config, results, summaries


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str  # the one name: command, package, flow task, settings group, timeout and result file
    program: str  # `python -m <program>`: what the CLI and the flow start
    summary: str  # one line for `stoke --help`
    settings: type[BaseModel]  # its group of the run configuration
    result: type[results.Result]  # the JSON object its program prints last: ROOT/runs/<id>/<name>.json (layout.py)
    # What the program takes beside its group, by hand its flags too: run-wide settings of RunConfig and
    # facts of the run (run_config.RunFacts); those in `required` must be given.
    inputs: tuple[str, ...] = ("root",)
    required: tuple[str, ...] = ("root",)

    @property
    def writes_result(self) -> bool:
        """Whether its program, given the run (`run_id`), writes its result into the run folder itself, as its
        last act; the flow writes what the others print."""
        return "run_id" in self.inputs

    @property
    def package(self) -> str | None:
        """Its package under components/ (`train`), or None for a program elsewhere (beam_jobs)."""
        parts = self.program.split(".")
        return parts[1] if parts[0] == "components" else None


STAGES: tuple[Stage, ...] = (
    Stage("preflight", "components.preflight", "the machine before any GPU hour: SOURCE, disks, read speed, GPUs, "
          "/dev/shm, limits", config.PreflightConfig, summaries.PreflightSummary,
          inputs=("root", "source", "shard_cache", "imagenet_network")),
    Stage("ingest", "beam_jobs.ingest", "new images to a new span of GZIP TFRecords (Beam)",
          config.IngestConfig, summaries.IngestSummary,
          inputs=("source", "root", "arrived"), required=("source", "root")),
    Stage("datacheck", "components.datacheck", "a span's statistics against the published history, and its labels "
          "against the served model: errors quarantine it", config.DataCheckConfig, summaries.DataCheckSummary,
          inputs=("root", "span", "model_name")),
    Stage("train", "components.train", "published spans to a candidate SavedModel",
          config.TrainConfig, results.TrainMetrics,
          inputs=("root", "run_id", "preset", "shard_cache", "model_name")),
    Stage("gate", "components.gate", "TFMA against thresholds and the served model: blessed or not, with reasons",
          config.GateConfig, results.GateResult,
          inputs=("root", "run_id", "model_name", "shard_cache"), required=("root", "run_id")),
    Stage("push", "components.push", "a blessed candidate to a new version in the model repository",
          config.PushConfig, summaries.PushSummary,
          inputs=("root", "run_id", "model_name"), required=("root", "run_id")),
)


def stage(name: str) -> Stage:
    """The stage called `name`."""
    for candidate in STAGES:
        if name == candidate.name:
            return candidate
    raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in STAGES)}")
