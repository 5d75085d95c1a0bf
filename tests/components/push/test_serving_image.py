"""ROOT/serving: the rendered build context of the serving image."""
from __future__ import annotations

import os
import re

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components.push import serving_image as serving
from tests.components.gate_runs import gate_scenario


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


def test_models_config_parses_and_labels_canary_and_stable(trained_runs):
    first, third = trained_runs["push"]["good"][1]["version"], trained_runs["push"]["mixed"][1]["version"]
    text = open(os.path.join(trained_runs["root"], "serving", "models.config")).read()
    config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == ("stoke", "/models/stoke", "tensorflow")
    assert list(model.model_version_policy.specific.versions) == [first, third]
    assert dict(model.version_labels) == {"stable": first, "canary": third}


def test_build_context_is_self_contained(trained_runs):
    base = os.path.join(trained_runs["root"], "serving")
    first, third = trained_runs["push"]["good"][1]["version"], trained_runs["push"]["mixed"][1]["version"]
    for version in (first, third):
        copy = os.path.join(base, "models", "stoke", str(version), "saved_model.pb")
        original = os.path.join(trained_runs["root"], "models", "stoke", str(version), "saved_model.pb")
        assert open(copy, "rb").read() == open(original, "rb").read()
    dockerfile = open(os.path.join(base, "Dockerfile")).read()
    assert re.search(r"^FROM tensorflow/serving:2\.21\.0$", dockerfile, re.M)
    assert "COPY models/ /models/" in dockerfile and "--model_config_file=/config/models.config" in dockerfile
    assert "--monitoring_config_file=/config/monitoring.config" in dockerfile
    assert "--batching_parameters_file=/config/batching.config" in dockerfile
    assert "FROM tensorflow/serving:2.21.0-gpu" in open(os.path.join(base, "Dockerfile.gpu")).read()
    batching = open(os.path.join(base, "batching.config")).read()
    sizes = [int(s) for s in re.findall(r"allowed_batch_sizes: (\d+)", batching)]
    assert sizes == sorted(sizes) and sizes[-1] == int(re.search(r"max_batch_size \{ value: (\d+) \}", batching).group(1))
    monitoring = open(os.path.join(base, "monitoring.config")).read()
    assert "prometheus_config" in monitoring and 'path: "/monitoring/prometheus/metrics"' in monitoring
    commands = trained_runs["push"]["mixed"][1]["commands"]
    assert commands["docker_build"] == f"docker build -t stoke-serving-stoke:{third} {base}"
    assert commands["docker_run"].startswith("docker run --rm -p 8500:8500 -p 8501:8501 stoke-serving-stoke:")


def test_server_never_older_than_the_training_tensorflow():
    serving.check_server_version("2.21.0", "2.21.0")
    serving.check_server_version("2.20.1", "2.21.0")
    with pytest.raises(serving.ServingError, match="newer than tensorflow/serving:2.20.0"):
        serving.check_server_version("2.21.0", "2.20.0")
    assert serving.version_tuple(serving.SERVING_VERSION) >= serving.version_tuple("2.21")


def test_templates_ship_as_package_data():
    files = serving.render_text("digits", [7, 9], "2.21.0")
    assert set(files) == {"Dockerfile", "Dockerfile.gpu", "models.config", "batching.config", "monitoring.config",
                          "prometheus.yml"}
    assert not any("$" in text for text in files.values())  # every placeholder filled
    config = text_format.Parse(files["models.config"], model_server_config_pb2.ModelServerConfig())
    assert dict(config.model_config_list.config[0].version_labels) == {"stable": 7, "canary": 9}
