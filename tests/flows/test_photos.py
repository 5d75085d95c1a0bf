"""`stoke run` on camera-sized photos, as a new user's first hour goes: the production preset on a
machine that cannot fetch ImageNet weights stops in seconds with the ways out; the cpu preset learns
the photos from scratch and its model is blessed."""
from __future__ import annotations

import json

import pytest

from benchmarks.photo_sets import make_photo_set
from components.common.files import exists, read_json
from components.contracts.layout import Root
from flows import cli
from tests.flows.conftest import TINY_BEAM

BEAM = [f"--set=beam_args={json.dumps(TINY_BEAM)}"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    """80 JPEGs of 1600x1200, 20 crops of each of four of scikit-image's pictures."""
    folder = tmp_path_factory.mktemp("photos")
    make_photo_set(folder, per_class=20, seed=1)
    return str(folder)


def _run(capsys, *argv) -> tuple[int, dict, str]:
    code = cli.main(["run", *argv, "--no-preflight", "--json", *BEAM])
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), err


def test_production_without_reachable_weights_stops_with_the_ways_out(photos, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty-keras-cache"))  # and no weights bucket answers here
    (tmp_path / "empty-keras-cache").mkdir()
    code, summary, err = _run(capsys, photos, "--root", str(tmp_path / "root"), "--run-id", "production")
    assert code == 1 and summary["status"] == "failed"
    (line,) = [line for line in err.splitlines() if line.startswith("stoke run: error:")]
    assert line.startswith("stoke run: error: train: train.weights imagenet: "
                           "efficientnet_b0's ImageNet weights are not in the Keras cache")
    for way_out in ("--weights PATH", "--weights none", "--set train.weights=PATH", "--preset cpu"):
        assert way_out in line
    run = Root(str(tmp_path / "root")).run("production")
    assert read_json(run.report_json)["status"] == "failed" and not exists(run.backup) and not exists(run.candidate)


def test_the_cpu_preset_learns_camera_photos_from_scratch_and_is_blessed(photos, tmp_path, capsys):
    code, summary, _ = _run(capsys, photos, "--root", str(tmp_path / "root"), "--run-id", "cpu", "--preset", "cpu",
                            "--set", "train.seed=1", "--set", "push.build_image=false")
    assert code == 0 and summary["blessed"] and summary["status"] == "pushed", summary["reasons"]
    metrics = read_json(Root(str(tmp_path / "root")).run("cpu").metrics)
    assert (metrics["network"], metrics["image_size"], metrics["weights"]) == ("small_cnn", 64, "none")
    assert metrics["total_steps"] >= 600 and metrics["total_steps"] - metrics["steps_per_epoch"] < 600  # min_steps
    assert [p["name"] for p in metrics["phases"]] == ["all"] and metrics["warnings"] == []
