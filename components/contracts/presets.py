"""Named presets: values for the settings a run leaves unset (None), group by group.

A preset resolves once, in the run configuration (run_config.py RunConfig.resolved): the recorded
config.json, which every stage program reads, holds its values, and a stage run by hand resolves its
flags the same way, once; so no stage looks a preset up again.
What a user sets always wins: a preset fills only what is None.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# production: real photos on an accelerator, fine-tuned from ImageNet weights, since a few hundred or
# thousand photos are far too few to train efficientnet_b0 from scratch (components/train/recipe.py:
# the head first, then the backbone at a lower rate). cpu: photos on a CPU, in minutes, from scratch:
# a small network at a small size, and enough optimizer steps however few the photos (docs/train.md).
# demo: the 1,797 digits of `make run` at 32 px, seconds per epoch on a CPU (400 steps at batch 32:
# 0.96-0.98 eval accuracy, docs/train.md); no flips, since a mirrored digit is another glyph.
PresetName = Literal["production", "cpu", "demo"]
PRESETS: dict[str, dict[str, dict]] = {
    "production": {"train": {"network": "efficientnet_b0", "weights": "imagenet", "image_size": 224, "epochs": 30,
                             "flip": True, "input_probe_steps": 30}},
    "cpu": {"train": {"network": "small_cnn", "weights": "none", "image_size": 64, "min_steps": 600, "flip": True,
                      "input_probe_steps": 10}},
    "demo": {"train": {"network": "small_cnn", "weights": "none", "image_size": 32, "epochs": 8, "flip": False,
                       "input_probe_steps": 10, "batch_size": 32}},
}


def fill(preset: str, group: str, settings: BaseModel) -> BaseModel:
    """`settings` of `group` with each field left unset (None) taken from the preset."""
    unset = {name: value for name, value in PRESETS[preset].get(group, {}).items() if getattr(settings, name) is None}
    return settings.model_copy(update=unset) if unset else settings
