"""Presets: the defaults are for photos on an accelerator, the demo preset holds the digits' values,
a preset resolves once in the run configuration, and what a user sets is never overridden."""
from __future__ import annotations

import pytest

from components.common import program
from components.contracts.config import TrainConfig
from components.contracts.presets import PRESETS
from components.contracts.run_config import RunConfig


def resolved(preset: str = "production", **train) -> TrainConfig:
    return RunConfig(source="s", root="r", preset=preset, train=TrainConfig(**train)).resolved().train


def test_the_defaults_are_for_photos_on_an_accelerator_fine_tuned_from_imagenet():
    config = resolved()
    assert (config.network, config.image_size, config.flip, config.epochs) == ("efficientnet_b0", 224, True, 30)
    assert config.weights == "imagenet" and TrainConfig().weights is None  # the preset's, not the field's
    assert config.batch_size is None  # sized from the data and the replicas


def test_the_cpu_preset_trains_a_small_network_from_scratch_for_a_number_of_steps():
    config = resolved("cpu")
    assert (config.network, config.weights, config.image_size, config.flip) == ("small_cnn", "none", 64, True)
    assert config.epochs is None and config.min_steps == 600  # epochs follow from the data's size
    assert resolved("cpu", epochs=3).epochs == 3  # a user's epochs are the epochs


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_says_where_the_weights_come_from(preset):
    assert resolved(preset).weights in ("none", "imagenet")
    assert resolved(preset, weights="/w.h5").weights == "/w.h5"


def test_the_demo_preset_is_the_digits_settings():
    config = resolved("demo")
    assert (config.network, config.image_size, config.flip, config.epochs, config.batch_size, config.weights) == (
        "small_cnn", 32, False, 8, 32, "none")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_what_the_user_sets_wins_over_the_preset(preset):
    config = resolved(preset, image_size=64, flip=False, epochs=3, network="resnet50")
    assert (config.network, config.image_size, config.flip, config.epochs) == ("resnet50", 64, False, 3)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_resolving_twice_changes_nothing(preset):
    once = RunConfig(source="s", root="r", preset=preset).resolved()
    assert once.resolved() == once


def test_the_train_program_by_hand_resolves_the_same_preset_as_a_run():
    by_hand, _ = program.stage_config("train", program.stage_arguments("train", ["--root", "/r", "--preset", "demo"]))
    assert by_hand.train == resolved("demo")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_preset_fills_only_settings_that_are_left_unset_until_it_does(preset):
    for group, values in PRESETS[preset].items():
        model = RunConfig.model_fields[group].annotation
        assert set(values) <= set(model.model_fields), (preset, group)
        assert all(model.model_fields[name].default is None for name in values), (preset, group)
        model.model_validate(values)  # every value is one the setting allows
