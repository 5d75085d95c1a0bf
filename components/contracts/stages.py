"""The stage registry: every stage of the pipeline, once, in the order the `train` flow runs them.

The CLI (`stoke <stage>`), `stoke run`'s option groups, the flow's parameter groups and timeouts,
the report's sections and the house-rules test all read this list, so none of them keeps its own.
Adding a stage is one package under components/ (a program: `python -m components.<name>`), one
entry here, its tests, and the one line in flows/train.py that says where it runs.
"""
from __future__ import annotations

import dataclasses

from pydantic import BaseModel

from components.contracts import config, results, summaries


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str  # the one name: command, package, flow task, parameter group, timeout, summary file
    program: str  # `python -m <program>`: what the CLI and the flow start
    summary: str  # one line for `stoke --help`
    settings: type[BaseModel] | None  # the program's settings; their fields are its options
    result: type[results.Result]  # the JSON object its program prints last, and the flow keeps
    timeout_minutes: float | None  # how long the flow lets it run (None: it runs inside the flow)
    reads: tuple[str, ...] = ()  # what it reads under ROOT (layout names)
    writes: tuple[str, ...] = ()  # what it writes under ROOT
    # Settings fields the flow decides itself (ROOT, SOURCE, the run id, the model name), and those it
    # takes once for every stage that has them (the shard cache of preflight, training and the gate).
    flow_decides: tuple[str, ...] = ("root", "source", "run_id", "model_name", "cache_dir", "cache_max_gb")
    aliases: tuple[str, ...] = ()  # earlier names, still accepted for one release

    @property
    def package(self) -> str | None:
        """Its package under components/ (`train`), or None for a program elsewhere (beam_jobs)."""
        parts = self.program.split(".")
        return parts[1] if parts[0] == "components" else None


STAGES: tuple[Stage, ...] = (
    Stage("preflight", "components.preflight", "the machine before any GPU hour: disks, read speed, GPUs, "
          "/dev/shm, limits", config.PreflightConfig, summaries.PreflightSummary, 10,
          reads=("data/spans/*/ (shards, to time reads)",), aliases=("doctor",)),
    Stage("ingest", "beam_jobs.ingest", "new images to a new span of GZIP TFRecords (Beam)",
          config.IngestConfig, summaries.IngestSummary, 240,
          reads=("data/labels.json", "data/spans/*/_MANIFEST.json", "runs/ID/arrived.txt (announced files)"),
          writes=("data/labels.json", "data/spans/span-N/ (shards, dead_letter.jsonl, _MANIFEST.json last)"),
          flow_decides=("root", "source", "run_id", "model_name", "arrived")),
    Stage("datacheck", "components.datacheck", "the new span's statistics against the published history: "
          "errors quarantine it", config.DataCheckConfig, summaries.DataCheckSummary, 30,
          reads=("data/spans/*/ (statistics.pb, _MANIFEST.json, content index)",),
          writes=("data/spans/span-N/_QUARANTINE.json (on an error)",), flow_decides=("root", "span")),
    Stage("train", "components.train", "published spans to a candidate SavedModel",
          config.TrainConfig, results.TrainMetrics, 24 * 60,
          reads=("data/spans/*/ (train and eval shards)",),
          writes=("runs/ID/ (backup, tensorboard, candidate, curves.png, metrics.json last)",)),
    Stage("gate", "components.gate", "TFMA against thresholds and the served model: blessed or not, with reasons",
          config.GateConfig, results.Validation, 120,
          reads=("runs/ID/metrics.json", "runs/ID/candidate", "data/spans/*/ (eval shards)", "models/NAME/"),
          writes=("runs/ID/ (tfma, warmup, confusion_matrix.png, validation.json, BLESSED or NOT_BLESSED)",),
          aliases=("validate", "validation")),
    Stage("push", "components.push", "a blessed candidate to a new version in the model repository",
          config.PushConfig, summaries.PushSummary, 30,
          reads=("runs/ID/ (validation.json, BLESSED, candidate, warmup)",),
          writes=("models/NAME/VERSION/", "serving/", "runs/ID/pushed.json")),
    Stage("report", "components.report", "(re)build a run's report from its folder",
          None, summaries.RunReport, None,
          reads=("runs/ID/",), writes=("runs/ID/ (report.md, report.json, plots)",)),
)


def stage(name: str) -> Stage:
    """The stage called `name` (or by an earlier name of it)."""
    for candidate in STAGES:
        if name == candidate.name or name in candidate.aliases:
            return candidate
    raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in STAGES)}")
