"""Presets: the defaults are for photos on an accelerator, `--preset demo` holds the demo's values,
and what a user sets is never overridden by either."""
from __future__ import annotations

import argparse

import pytest

from components.contracts.config import PRESETS, TrainConfig, add_arguments, from_arguments
from components.contracts.stages import stage
from flows import parameters


def parsed(*argv: str) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig)
    return from_arguments(TrainConfig, parser.parse_args(["--root", "/r", *argv])).resolved()


def test_the_defaults_are_for_photos_on_an_accelerator():
    config = parsed()
    assert (config.model, config.image_size, config.flip, config.epochs) == ("efficientnet_b0", 224, True, 30)
    assert config.batch_size is None  # sized from the data and the replicas


def test_the_demo_preset_is_the_digits_settings():
    config = parsed("--preset", "demo")
    assert (config.model, config.image_size, config.flip, config.epochs, config.batch_size) == (
        "small_cnn", 32, False, 8, 32)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_what_the_user_sets_wins_over_the_preset(preset):
    config = parsed("--preset", preset, "--image-size", "64", "--no-flip", "--epochs", "3", "--model", "resnet50")
    assert (config.model, config.image_size, config.flip, config.epochs) == ("resnet50", 64, False, 3)


def test_stoke_train_stoke_run_and_the_flow_share_one_set_of_defaults():
    flow_defaults = parameters.TrainSettings().model_dump()
    program_defaults = TrainConfig(root="/r").model_dump(exclude=set(stage("train").flow_decides))
    assert flow_defaults == program_defaults and flow_defaults["preset"] == "production"
    assert TrainConfig(root="/r", **flow_defaults).resolved().model == "efficientnet_b0"


def test_a_preset_fills_only_fields_the_settings_have():
    for values in PRESETS.values():
        assert set(values) <= set(TrainConfig.model_fields)
