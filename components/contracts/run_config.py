"""The run configuration: one `RunConfig` describes a run of the `train` flow, and each stage program
takes its part of it.

A RunConfig is the run-wide fields (source, root, model name, preset, shard cache, Beam options,
timeouts) plus one group per stage of the registry. It is the flow's parameters, what `stoke run`,
`stoke up` and `stoke deploy` take (a file plus `--set group.field=value`, components/common/config_files.py), and, once
resolved (presets applied), what the run records as ROOT/runs/<id>/config.json before its first
stage. Each stage program gets its settings as a file in the run folder: its group plus the inputs
the registry names (`stage_settings`), validated by the same fields the program's flags come from
(`program_model`), so a setting is written once, as a field of its group.
"""
from __future__ import annotations

import functools

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from components.contracts import presets
from components.contracts.beam_options import BeamArgs
from components.contracts.config import (
    MAX_SPAN,
    SETTINGS_CONFIG,
    DataCheckConfig,
    GateConfig,
    IngestConfig,
    Network,
    PreflightConfig,
    PushConfig,
    RootLocation,
    RunId,
    RunsConfig,
    ServedModelName,
    ShardCacheConfig,
    SourceLocation,
    TrainConfig,
)
from components.contracts.stages import STAGES, Stage, stage

MAX_TIMEOUT_MINUTES = 30 * 24 * 60  # a stage that may run for a month
Timeouts = create_model(
    "Timeouts", __config__=ConfigDict(extra="forbid", allow_inf_nan=False),
    __doc__="Minutes each stage program may run before it is stopped (SIGTERM, then SIGKILL).",
    **{s.name: (float, Field(s.timeout_minutes, gt=0, le=MAX_TIMEOUT_MINUTES, description=f"minutes for {s.name}"))
       for s in STAGES})


class RunConfig(BaseModel):
    """One run of the `train` flow: what to read, where to write, and every stage's settings."""

    model_config = SETTINGS_CONFIG

    source: SourceLocation = Field(description="raw images: a folder of class subfolders, or a CSV/JSONL manifest "
                                   "of uri,label[,split]; a local path, file://, s3://, gs:// or http(s)://")
    root: RootLocation = Field(description="artifact ROOT: a local path, file://, s3:// or gs://")
    model_name: ServedModelName = Field("stoke", description="model in ROOT/models that the run gates against "
                                        "and pushes to (TF Serving's model name)")
    preset: presets.PresetName = Field(
        "production", description="values for the settings left unset: production (photos on an accelerator: "
        "efficientnet_b0 fine-tuned from ImageNet weights at 224 px, flips, 30 epochs), cpu (photos on a CPU, in "
        "minutes: small_cnn from scratch at 64 px, flips, at least 600 steps) or demo (the digits of `make run`: "
        "small_cnn at 32 px, no flips, 8 epochs, batch 32)")
    shard_cache: ShardCacheConfig = ShardCacheConfig()
    runs: RunsConfig = RunsConfig()
    beam_args: BeamArgs = Field([], description="Beam options of the run's ingest, --NAME=VALUE, among those that "
                                "size its runner (the runner itself belongs to the deployment)")
    timeouts: Timeouts = Timeouts()
    preflight: PreflightConfig | None = Field(PreflightConfig(), description="null skips the preflight checks")
    ingest: IngestConfig = IngestConfig()
    datacheck: DataCheckConfig = DataCheckConfig()
    train: TrainConfig = TrainConfig()
    gate: GateConfig = GateConfig()
    push: PushConfig = PushConfig()

    def resolved(self) -> RunConfig:
        """This configuration with the preset's values in every field left unset."""
        groups = {s.name: presets.fill(self.preset, s.name, getattr(self, s.name)) for s in STAGES
                  if getattr(self, s.name) is not None}
        return self.model_copy(update=groups)


# Facts of one run that a stage program takes beside its group: the flow knows them, a person running
# a stage by hand names them.
RUN_FACTS = {
    "run_id": (RunId | None, Field(None, description="run folder under ROOT/runs; the same id resumes a stopped "
                                   "run (default: a new one)")),
    "arrived": (str | None, Field(None, description="a file of URIs in SOURCE, one a line, that bucket "
                                  "notifications announced: only these are read, instead of listing all of SOURCE")),
    "span": (int | None, Field(None, gt=0, le=MAX_SPAN, description="span to check (default: the newest published)")),
    "imagenet_network": (Network | None, Field(None, description="a network whose ImageNet weights training will "
                                               "load (the flow names train.network when train.weights is imagenet): "
                                               "preflight checks they can be had")),
}


@functools.cache
def program_model(of: Stage) -> type[BaseModel]:
    """The settings of the stage's program: its group, plus its inputs (required as the registry says)."""
    inputs = {}
    for name in of.inputs:
        annotation, field = RUN_FACTS[name] if name in RUN_FACTS else (RunConfig.model_fields[name].annotation,
                                                                        RunConfig.model_fields[name])
        if name in of.required:
            field = FieldInfo.merge_field_infos(field, default=PydanticUndefined)
        elif field.is_required():
            annotation, field = annotation | None, FieldInfo.merge_field_infos(field, default=None)
        inputs[name] = (annotation, field)
    return create_model(f"{of.settings.__name__.removesuffix('Config')}Settings", __base__=of.settings,
                        __doc__=of.settings.__doc__, **inputs)


def stage_settings(of: Stage, config: RunConfig, **facts) -> BaseModel:
    """What the flow hands the stage's program: its group of `config` and its inputs, from `config` or `facts`."""
    inputs = {name: facts[name] if name in RUN_FACTS else getattr(config, name)
              for name in of.inputs if name in facts or name not in RUN_FACTS}
    return program_model(of).model_validate({**getattr(config, of.name).model_dump(), **inputs})


# The settings of each stage program by name, for the programs' signatures.
PreflightSettings = program_model(stage("preflight"))
IngestSettings = program_model(stage("ingest"))
DataCheckSettings = program_model(stage("datacheck"))
TrainSettings = program_model(stage("train"))
GateSettings = program_model(stage("gate"))
PushSettings = program_model(stage("push"))
