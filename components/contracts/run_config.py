"""The run configuration: one `RunConfig` describes a run of the `train` flow, and it is the only
settings object: every stage program reads the whole of it.

A RunConfig is the run-wide fields (source, root, model name, preset, shard cache, retention, alerts, Beam
options, timeouts) plus one group per stage of the registry. It is the flow's parameters, what `stoke run`,
`stoke up` and `stoke deploy` take (a file plus `--set group.field=value`, components/common/config_files.py), and, once
resolved (presets applied), what the run records as ROOT/runs/<id>/config.json before its first
stage. The flow starts each stage program on that file (`--config ROOT/runs/<id>/config.json`); a
program run by hand builds the same RunConfig from its flags (components/common/program.py). A stage
reads its settings where it uses them, as `config.<group>.<field>`, so a setting is written once, as
a field of its group. The facts of one run (its id, a span, the files that arrived) are not settings:
they travel beside the configuration (`RunFacts`).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator

from components.contracts import presets, stages
from components.contracts.beam_options import BeamArgs
from components.contracts.config import (
    MAX_SPAN,
    SETTINGS_CONFIG,
    AlertsConfig,
    DataCheckConfig,
    GateConfig,
    IngestConfig,
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

MAX_TIMEOUT_MINUTES = 30 * 24 * 60  # a stage that may run for a month


# One setting per stage of the registry, `timeouts.<name>`, its default the entry's `timeout`: a stage added
# there has its timeout here without an edit.
Timeouts = create_model(
    "Timeouts", __config__=ConfigDict(extra="forbid", allow_inf_nan=False), __module__=__name__,
    __doc__="Minutes each stage program may run before it is stopped (SIGTERM, then SIGKILL).",
    **{s.name: (float, Field(s.timeout, gt=0, le=MAX_TIMEOUT_MINUTES, description=f"minutes for {s.name}"))
       for s in stages.STAGES})


class RunConfig(BaseModel):
    """One run of the `train` flow: what to read, where to write, and every stage's settings."""

    model_config = SETTINGS_CONFIG

    # Required by the stages that read it (the registry's `required`: preflight, ingest) and by the flow.
    source: SourceLocation | None = Field(
        None, description="raw images: a folder of class subfolders, or a CSV/JSONL manifest of uri,label[,split]; "
        "a local path, file://, s3://, gs:// or http(s)://")
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
    alerts: AlertsConfig = AlertsConfig()
    beam_args: BeamArgs = Field([], description="Beam options of the run's ingest, --NAME=VALUE, among those that "
                                "size its runner (the runner itself belongs to the deployment)")
    timeouts: Timeouts = Timeouts()
    preflight: PreflightConfig | None = Field(PreflightConfig(), description="null skips the preflight checks")
    ingest: IngestConfig = IngestConfig()
    datacheck: DataCheckConfig = DataCheckConfig()
    train: TrainConfig = TrainConfig()
    gate: GateConfig = GateConfig()
    push: PushConfig = PushConfig()

    @field_validator("alerts")
    @classmethod
    def _alerts_within_the_records(cls, alerts: AlertsConfig, info: ValidationInfo) -> AlertsConfig:
        runs = info.data.get("runs")  # declared before alerts: validated first (absent when it was refused)
        if runs is not None and alerts.after > runs.keep_records:
            raise ValueError(f"after ({alerts.after}) must be at most runs.keep_records ({runs.keep_records}): the "
                             "runs in a row are counted from the records kept")
        return alerts

    def resolved(self) -> RunConfig:
        """This configuration with the preset's values in every field left unset."""
        groups = {s.name: presets.fill(self.preset, s.name, getattr(self, s.name)) for s in stages.STAGES
                  if s.settings is not None and getattr(self, s.name) is not None}
        return self.model_copy(update=groups)


def preset_problem(base: dict, preset: str, named: str) -> str | None:
    """Why the configuration `base` (the data of `named`: a settings file, a deployment's parameters) may not
    take `preset`, or None. A configuration that names another preset and sets every setting that preset fills
    is resolved already, as a run's config.json is: `preset` would fill only what the other left unset, and put
    its name on a run of the other's network, size and epochs."""
    held = base.get("preset", RunConfig.model_fields["preset"].default)
    if preset == held or held not in presets.PRESETS:
        return None
    for group, values in presets.PRESETS[held].items():
        if not isinstance(base.get(group), dict) or any(base[group].get(name) is None for name in values):
            return None
    return (f"preset {preset} over {named}, which holds the {held} preset's values already (a run's config.json is "
            f"resolved): {preset} would fill only what {held} left unset; drop the preset to run it as it is, or "
            "start from a file of your own that leaves those settings unset")


class RunFacts(BaseModel):
    """Facts of one run that a stage program takes beside the configuration (the registry's `inputs`
    name which): the flow knows them, a person running a stage by hand names them."""

    model_config = SETTINGS_CONFIG

    run_id: RunId | None = Field(None, description="run folder under ROOT/runs; the same id resumes a stopped run "
                                 "(default: a new one)")
    arrived: str | None = Field(None, description="a file of URIs in SOURCE, one a line, that bucket notifications "
                                "announced: only these are read, instead of listing all of SOURCE")
    span: int | None = Field(None, gt=0, le=MAX_SPAN, description="span to check (default: the newest published)")
