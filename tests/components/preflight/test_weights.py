"""Preflight finds out whether the ImageNet weights a run starts from can be had, before ingest runs."""
from __future__ import annotations

import hashlib
import http.server
import socket

import pytest

from components.common import pretrained
from components.common.program import stage_arguments, stage_config
from components.preflight.preflight import run_checks
from components.preflight.weights import imagenet_check
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


def test_the_check_runs_only_for_a_run_that_starts_from_imagenet(keras_home, monkeypatch, tmp_path):
    at(monkeypatch, "http://127.0.0.1:9/")
    root = str(tmp_path / "root")
    names = [c.name for c in run_checks(root, sample_mb=1).checks]
    assert "ImageNet weights" not in names
    report = run_checks(root, sample_mb=1, imagenet_network=NETWORK)
    (check,) = [c for c in report.checks if c.name == "ImageNet weights"]
    assert check.status == "fail" and report.failure_line().startswith("ImageNet weights failed")


def test_the_flow_and_a_person_name_the_network_alike():
    from components.contracts.run_config import RunConfig

    _, by_hand = stage_config("preflight", stage_arguments("preflight", ["--root", "r", "--imagenet-network", NETWORK]))
    config = RunConfig(source="s", root="r", preset="production").resolved()
    assert config.train.weights == "imagenet"
    assert by_hand.imagenet_network == config.train.network == NETWORK
