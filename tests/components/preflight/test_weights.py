"""Preflight finds out whether the ImageNet weights a run starts from can be had, before ingest runs."""
from __future__ import annotations

import hashlib
import http.server
import json
import socket

import pytest

from components.common import pretrained
from components.contracts.run_config import RunConfig
from components.preflight import preflight
from components.preflight.weights import imagenet_check, imagenet_network
from tests.waiting import web_server

NETWORK = "efficientnet_b0"


@pytest.fixture
def keras_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    (tmp_path / "keras" / "models").mkdir(parents=True)
    return tmp_path / "keras"


@pytest.fixture
def server():
    """A web server on 127.0.0.1 that has one file, `weights.h5`, and answers 404 for anything else."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200 if self.path == "/weights.h5" else 404)
            self.send_header("Content-Length", "21000000")
            self.end_headers()

        def log_message(self, *args):
            pass

    with web_server(Handler) as port:
        yield f"http://127.0.0.1:{port}/"


def at(monkeypatch, base: str, name: str = "weights.h5", md5: str = "0" * 32):
    monkeypatch.setitem(pretrained.IMAGENET, NETWORK, (name, base, md5))


def test_a_copy_in_the_keras_cache_whose_hash_matches_is_enough(keras_home, monkeypatch):
    (keras_home / "models" / "weights.h5").write_bytes(b"weights")
    at(monkeypatch, "http://127.0.0.1:9/", md5=hashlib.md5(b"weights").hexdigest())
    check = imagenet_check(NETWORK)
    assert check.status == "ok" and str(keras_home / "models" / "weights.h5") in check.summary


def test_weights_the_address_serves_are_downloaded_by_training(keras_home, monkeypatch, server):
    (keras_home / "models" / "weights.h5").write_bytes(b"not the published file")  # trusted on its hash only
    at(monkeypatch, server)
    check = imagenet_check(NETWORK)
    assert check.status == "ok" and f"downloads them from {server}weights.h5 (21 MB)" in check.summary


@pytest.mark.parametrize("where", ["refused", "missing"])
def test_weights_that_cannot_be_had_fail_the_check_with_the_ways_out(keras_home, monkeypatch, server, where):
    if where == "refused":
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            base = f"http://127.0.0.1:{s.getsockname()[1]}/"
    else:
        base = server + "gone/"
    at(monkeypatch, base)
    check = imagenet_check(NETWORK, timeout=2)
    assert check.status == "fail", check
    assert f"not in the Keras cache ({keras_home / 'models' / 'weights.h5'})" in check.summary
    assert ("Connection refused" if where == "refused" else "Not Found") in check.summary
    assert "set train.weights to a local Keras .h5 such as weights.h5" in check.fix and "--set train.weights=none" in check.fix


# (the run configuration's settings, the network whose ImageNet weights preflight looks for: None when training loads
# none of ImageNet's itself)
RUNS = [
    ({}, NETWORK),  # the production preset: efficientnet_b0 from ImageNet
    ({"train": {"weights": "none"}}, None),
    ({"train": {"weights": "backbone.h5"}}, None),
    ({"preset": "cpu"}, None),
    ({"preset": "cpu", "train": {"network": "mobilenet_v3_small", "weights": "imagenet"}}, "mobilenet_v3_small"),
    ({"train": {"network": "keras.applications.ResNet50"}}, "keras.applications.ResNet50"),
    # the user's code fetches its own as it is built: the network check builds it
    ({"train": {"network": "nets.wide:network"}}, None),
    ({"train": {"network": "nets/wide.py:network"}}, None),
]


@pytest.mark.parametrize("settings, checked", RUNS, ids=[json.dumps(run[0]) for run in RUNS])
def test_the_check_is_for_the_network_whose_imagenet_weights_training_loads(settings, checked):
    assert imagenet_network(RunConfig(root="r", **settings).resolved().train) == checked


@pytest.mark.parametrize("train, flags, checked", [
    ({}, [], True),  # the production preset's weights
    ({"weights": "none"}, [], False),
    ({}, ["--preset", "cpu"], False),
], ids=["production", "weights none", "cpu preset"])
def test_preflight_by_hand_looks_for_the_weights_its_configuration_starts_from(train, flags, checked, keras_home,
                                                                               monkeypatch, tmp_path, capsys):
    """As the flow runs it, on the run's config.json, and as a person runs it, on a file of their own or a preset."""
    at(monkeypatch, "http://127.0.0.1:9/")
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"preflight": {"sample_mb": 1}, "train": {"image_size": 32, **train}}))
    code = preflight.run(["--config", str(config), "--root", str(tmp_path / "root"), "--json", *flags])
    out, err = capsys.readouterr()
    checks = {c["name"]: c for c in json.loads(out.strip().splitlines()[-1])["checks"]}
    assert checks["network"]["status"] == "ok", checks["network"]
    if checked:
        assert code == 1 and checks["ImageNet weights"]["status"] == "fail"
        line = err.strip().splitlines()[-1]
        assert line.startswith("stoke preflight: ImageNet weights failed: efficientnet_b0's are not in the Keras cache")
    else:
        assert code == 0 and "ImageNet weights" not in checks, err
