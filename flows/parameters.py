"""Typed parameters of the `train` flow, derived from the stages' own config models.

Each stage declares its settings once, in components/contracts/config.py; the flow's parameter models are
those same fields minus what the flow decides itself (ROOT, SOURCE, the run id), with the demo's
values as defaults so a bare `stoke run` or `prefect deployment run train/nightly` finishes in
minutes on a laptop. The Prefect UI renders the descriptions as help text.
"""
from __future__ import annotations

import copy

from pydantic import BaseModel, ConfigDict, Field, create_model

from components.contracts import config

# The demo's data and artifact ROOT, relative to where `make run` runs.
DEMO_SOURCE = ".stoke/demo/digits"
DEMO_ROOT = ".stoke/root"
DEMO_EPOCHS = 8  # 400 steps at batch 32: 0.96-0.98 eval accuracy on the digits (README, Training)


def derived(name: str, model: type[BaseModel], drop: set[str], **defaults) -> type[BaseModel]:
    """`model` without the fields in `drop`, with some defaults replaced; validation kept."""
    fields = {}
    for key, field in model.model_fields.items():
        if key in drop:
            continue
        if key in defaults:
            field = copy.copy(field)
            field.default = defaults[key]
        fields[key] = (field.annotation, field)
    return create_model(name, __config__=ConfigDict(extra="forbid", protected_namespaces=()),
                        __doc__=model.__doc__, **fields)


# The digits are 32x32: small_cnn at that size trains in seconds per epoch on a CPU. No flips:
# a mirrored digit is another glyph, not the same digit.
ModelSettings = derived("ModelSettings", config.TrainConfig, drop={"root", "run_id", "epochs"},
                        image_size=32, batch_size=32, probe_steps=10, flip=False)
IngestSettings = derived("IngestSettings", config.IngestConfig, drop={"source", "root"})
GateSettings = derived("GateSettings", config.ValidateConfig, drop={"root", "run_id", "model_name"})
PushSettings = derived("PushSettings", config.PushConfig, drop={"root", "run_id", "model_name"})
DoctorSettings = derived("DoctorSettings", config.DoctorConfig, drop={"root", "source"})


class Timeouts(BaseModel):
    """Minutes each stage program may run before it is stopped (SIGTERM, then SIGKILL)."""

    model_config = ConfigDict(extra="forbid")

    ingest: float = Field(240, gt=0, description="minutes for the Beam job")
    train: float = Field(24 * 60, gt=0, description="minutes for training (it resumes from its backup on a rerun)")
    validation: float = Field(120, gt=0, description="minutes for TFMA validation")
    push: float = Field(30, gt=0, description="minutes for the push into the model repository")
