"""The training image (infra/training/Dockerfile) and the serving image (rendered from
components/push/templates, the one source): parsed with BuildKit's parser, linted with hadolint,
and held to the code's versions, ports, paths and users."""
from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import tomllib

import dockerfile
import pytest

from components.common.serving import SERVING_VERSION
from components.push import serving_image as serving
from flows import work_pools
from tests.infra.conftest import REPO, infra, run_tool
from tests.waiting import free_port, web_server

TRAINING = infra("training", "Dockerfile")


def stages(commands) -> dict[str, list]:
    """Instructions per build stage, by stage name (or index)."""
    found, current = {}, None
    for command in commands:
        if command.cmd == "FROM":
            current = command.value[2] if len(command.value) == 3 else str(len(found))
            found[current] = []
        found[current].append(command)
    return found


def last(commands, cmd: str):
    matches = [c for c in commands if c.cmd == cmd]
    return matches[-1] if matches else None


def pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest") and re.search(r"\d", tag) is not None


@pytest.fixture(scope="module")
def training():
    return stages(dockerfile.parse_file(TRAINING))


@pytest.fixture(scope="module")
def rendered():
    return serving.render_text("stoke", [3, 4], "2.21.0")


def test_hadolint_passes_the_training_and_the_rendered_serving_images(rendered, tmp_path):
    result = run_tool("hadolint", "--no-color", TRAINING)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("Dockerfile", "Dockerfile.gpu"):
        path = tmp_path / name
        path.write_text(rendered[name])
        result = run_tool("hadolint", "--no-color", str(path))
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"


def test_hadolint_catches_what_it_should(tmp_path):
    # The linter runs for real: an unpinned base image running as root fails it.
    path = tmp_path / "Dockerfile"
    path.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    assert run_tool("hadolint", "--no-color", str(path)).returncode != 0


def test_training_image_pins_the_versions_the_project_pins(training):
    import apache_beam
    import tensorflow as tf

    images = [c.value[0] for cs in training.values() for c in cs if c.cmd == "FROM" and c.value[0] not in training]
    assert images and all(pinned(i) for i in images), images
    tf_image = next(i for i in images if i.startswith("tensorflow/tensorflow:"))
    beam_image = next(i for i in images if i.startswith("apache/beam_python"))
    tf_tag = tf_image.split(":")[1]
    assert tf_tag.endswith("-gpu")
    assert tf_tag.split(".")[:2] == tf.__version__.split(".")[:2]
    assert beam_image.split(":")[1].split(".")[:2] == apache_beam.__version__.split(".")[:2]
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert f"beam_{python}_sdk" in beam_image  # the boot loader's Python is the project's


def test_training_image_installs_every_package_and_runs_as_its_user(training):
    project = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {c.value[0].rstrip("/") for cs in training.values() for c in cs if c.cmd == "COPY" and not c.flags}
    assert packages <= copied and "pyproject.toml" in copied
    ignore = open(infra("training", "Dockerfile.dockerignore")).read().split()
    assert {f"!{p}/" for p in packages} <= set(ignore) and "*" in ignore  # the context holds them, nothing else
    for target in ("training", "beam-worker"):
        user = last(training[target], "USER")
        assert user is not None and user.value[0].split(":")[0] not in ("0", "root"), target
    assert last(training["training"], "ENTRYPOINT").value == ("stoke", "train")
    assert last(training["beam-worker"], "ENTRYPOINT").value == ("/opt/apache/beam/boot",)
    assert list(training)[-1] == "training"  # the default target


def test_training_image_installs_the_runtime_lock_exactly_and_stoke_on_top(training):
    """The image's packages are requirements/runtime.lock's, each by its hashes, and nothing else is installed
    by name (a package named here would be resolved on the day the image is built); Stoke goes on top,
    editable and without dependencies, with the lock beside it for the lineage (components/common/environment.py)."""
    runs = [" ".join(c.value) for cs in training.values() for c in cs if c.cmd == "RUN" and "pip" in " ".join(c.value)]
    assert [re.sub(r"\s+", " ", run).split(" && ")[0] for run in runs] == [
        "python3 -m pip install --no-cache-dir --no-deps --require-hashes -r requirements/runtime.lock",
        "python3 -m pip install --no-cache-dir --no-deps --no-build-isolation -e ."]
    copied = [c.value for cs in training.values() for c in cs if c.cmd == "COPY" and not c.flags]
    assert ("requirements/runtime.lock", "requirements/") in copied
    assert "!requirements/runtime.lock" in open(infra("training", "Dockerfile.dockerignore")).read().split()


def test_documented_docker_run_line_has_the_flags_training_needs():
    text = open(TRAINING).read()
    run = re.search(r"docker run (.+?)\n#\s+(.+?)\n", text)
    line = run.group(1) + " " + run.group(2)
    for flag in ("--gpus all", f"--shm-size={work_pools.SHM_SIZE}", "--ulimit memlock=-1",
                 f"--ulimit stack={work_pools.STACK_BYTES}", f"{work_pools.ROOT_VOLUME}:{work_pools.ROOT_MOUNT}",
                 work_pools.TRAINING_IMAGE):
        assert flag in line, flag
    assert f"-t {work_pools.TRAINING_IMAGE} ." in text
    version = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]["version"]
    assert work_pools.TRAINING_IMAGE == f"stoke-training:{version}"


def test_serving_image_is_only_the_rendered_one():
    # One source of truth: infra/serving documents ROOT/serving and keeps no Dockerfile of its own.
    assert not [n for n in os.listdir(infra("serving")) if n.lower().startswith("dockerfile") or n.endswith(".config")]
    assert "components/push/templates" in open(infra("serving", "README.md")).read()


@pytest.mark.parametrize("name, suffix", [("Dockerfile", ""), ("Dockerfile.gpu", "-gpu")])
def test_rendered_serving_image_matches_the_code(rendered, name, suffix):
    commands = dockerfile.parse_string(rendered[name])
    assert last(commands, "FROM").value[0] == f"{serving.SERVING_IMAGE}:{SERVING_VERSION}{suffix}"
    assert pinned(last(commands, "FROM").value[0])
    assert last(commands, "USER").value[0] == f"{serving.USER_ID}:{serving.USER_ID}" and serving.USER_ID != 0
    assert set(last(commands, "EXPOSE").value) == {str(serving.GRPC_PORT), str(serving.REST_PORT)}
    entry = last(commands, "ENTRYPOINT").value
    assert f"--port={serving.GRPC_PORT}" in entry and f"--rest_api_port={serving.REST_PORT}" in entry
    copied = {c.value[-1].rstrip("/") for c in commands if c.cmd == "COPY"}
    assert serving.MODEL_BASE_PATH in copied
    assert f'base_path: "{serving.MODEL_BASE_PATH}/stoke"' in rendered["models.config"]
    health = last(commands, "HEALTHCHECK")
    assert health.json and health.value[0] == "CMD" and f"/{serving.REST_PORT} " in health.value[3]


def healthcheck_command(rendered) -> list[str]:
    return list(last(dockerfile.parse_string(rendered["Dockerfile"]), "HEALTHCHECK").value[1:])


class _Status(http.server.BaseHTTPRequestHandler):
    state = "AVAILABLE"

    def do_GET(self):
        found = self.path == "/v1/models/stoke"
        body = json.dumps({"model_version_status": [{"version": "4", "state": self.state}]} if found
                          else {"error": "Servable not found"}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("state, healthy", [("AVAILABLE", True), ("LOADING", False)])
def test_health_check_passes_only_once_the_model_is_available(rendered, state, healthy):
    """The image's HEALTHCHECK itself, run by bash against a stand-in of TF Serving's model status."""
    handler = type("Status", (_Status,), {"state": state})
    with web_server(handler) as port:
        command = [part.replace(f"/{serving.REST_PORT} ", f"/{port} ") for part in healthcheck_command(rendered)]
        assert subprocess.run(command, timeout=10).returncode == (0 if healthy else 1)


def test_health_check_fails_with_no_server(rendered):
    port = free_port()  # nothing listens on it
    command = [part.replace(f"/{serving.REST_PORT} ", f"/{port} ") for part in healthcheck_command(rendered)]
    assert subprocess.run(command, timeout=10, capture_output=True).returncode != 0
