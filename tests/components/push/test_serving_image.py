"""ROOT/serving: the rendered build context of the serving image."""
from __future__ import annotations

import os
import re

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components.common.serving import SERVING_VERSION
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


def test_the_trained_tensorflow_is_read_from_either_form_of_a_saved_model(trained_runs, tmp_path):
    """TF Serving loads saved_model.pb or saved_model.pbtxt: push reads the TensorFlow that wrote either
    (through a view of three fields, skipping the rest of each form), and names one it cannot read."""
    import shutil

    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    version = trained_runs["push"]["good"][1]["version"]
    binary = os.path.join(trained_runs["root"], "models", "stoke", str(version))
    assert serving.saved_model_tf_version(binary) == tf.__version__
    text = str(tmp_path / "text")
    shutil.copytree(binary, text)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(open(os.path.join(text, "saved_model.pb"), "rb").read())
    os.remove(os.path.join(text, "saved_model.pb"))
    open(os.path.join(text, "saved_model.pbtxt"), "w").write(text_format.MessageToString(proto))
    assert serving.saved_model_tf_version(text) == tf.__version__
    open(os.path.join(text, "saved_model.pbtxt"), "w").write("meta_graphs { meta_info_def {")
    with pytest.raises(serving.ServingError, match=r"^\S+/text holds no SavedModel TensorFlow can read \("):
        serving.saved_model_tf_version(text)


def test_the_server_is_the_release_of_the_tensorflow_that_trained_the_model():
    """components/common/serving.py's table, by its rule (docs/push.md): the model's own TensorFlow's
    release; before the first row the first row's; after the last a refusal in one line."""
    import tensorflow as tf

    from components.common.serving import SERVING_RELEASES, serving_release

    assert SERVING_RELEASES["2.20"] == "2.20.0" and SERVING_RELEASES["2.21"] == "2.21.0"
    assert serving.server_for("2.21.0") == serving.server_for("2.21.4") == "tensorflow/serving:2.21.0"
    assert serving.server_for("2.20.1") == "tensorflow/serving:2.20.0"
    assert serving.server_for("2.18.0") == "tensorflow/serving:2.20.0"  # servers read older SavedModels
    with pytest.raises(serving.ServingError) as refused:
        serving.server_for("2.22.0")
    assert str(refused.value) == ("the model was written by TensorFlow 2.22.0, newer than the newest TF Serving Stoke "
                                  "pins (tensorflow/serving:2.21.0); add its release to SERVING_RELEASES in "
                                  "components/common/serving.py")
    assert serving_release(tf.__version__) == SERVING_VERSION  # the TensorFlow pyproject.toml pins has its row
    files = serving.render_text("stoke", [1, 2], "2.20.3")
    assert files["Dockerfile"].count("FROM tensorflow/serving:2.20.0\n") == 1
    assert "FROM tensorflow/serving:2.20.0-gpu\n" in files["Dockerfile.gpu"]


def test_templates_ship_as_package_data():
    files = serving.render_text("digits", [7, 9], "2.21.0")
    assert set(files) == {"Dockerfile", "Dockerfile.gpu", "models.config", "batching.config", "monitoring.config",
                          "prometheus.yml"}
    assert not any("$" in text for text in files.values())  # every placeholder filled
    config = text_format.Parse(files["models.config"], model_server_config_pb2.ModelServerConfig())
    assert dict(config.model_config_list.config[0].version_labels) == {"stable": 7, "canary": 9}


# A stand-in for the docker CLI: logs each call, answers `info` and `build`, and answers
# `image inspect` and `pull` as the scenario says. No container engine runs on the test machines.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  info) exit {info} ;;
  image) {local} ;;
  pull) {pull} ;;
  build) exit 0 ;;
esac
exit 2
"""
NO_SUCH_IMAGE = 'echo "Error: No such image: $3" >&2; exit 1'
PULLS = {
    "missing": 'echo "Error response from daemon: manifest for $2 not found: manifest unknown: manifest unknown" >&2; exit 1',
    "offline": 'echo "Error response from daemon: Get https://registry-1.docker.io/v2/: dial tcp: lookup '
               'registry-1.docker.io: no such host" >&2; exit 1',
    "pulled": 'echo "Status: Downloaded newer image for $2"; exit 0',
}


def fake_docker(tmp_path, monkeypatch, pull: str = "missing", local: bool = False, info: int = 0) -> str:
    """Puts a fake `docker` first on PATH; returns the file its calls are logged to."""
    folder, log = tmp_path / "fake-bin", tmp_path / "docker-calls.log"
    folder.mkdir()
    script = folder / "docker"
    script.write_text(FAKE_DOCKER.format(log=log, info=info, local="exit 0" if local else NO_SUCH_IMAGE, pull=PULLS[pull]))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    log.write_text("")
    return str(log)


def calls(log: str) -> list[str]:
    return [line.split()[0] for line in open(log).read().splitlines()]


BASE = f"{serving.SERVING_IMAGE}:{SERVING_VERSION}"


def test_push_does_not_build_on_a_base_image_tag_that_does_not_exist(trained_runs, tmp_path, monkeypatch):
    """`stoke push --build-image` with an engine that answers but a registry that lacks the tag."""
    from tests.components.gate_runs import copy_root, push_run

    root = copy_root(trained_runs, tmp_path)
    log = fake_docker(tmp_path, monkeypatch, pull="missing")
    code, summary = push_run(root, "mixed", "--build-image")
    assert code == 0 and summary["already_pushed"]
    image = summary["image"]
    assert image["built"] is False and "SERVING_RELEASES" in image["reason"]
    assert image["reason"].startswith(f"{BASE} does not exist in its registry (Error response from daemon: manifest for "
                                      f"{BASE} not found")
    assert calls(log) == ["info", "image", "pull"]  # never `build`


@pytest.mark.parametrize("scenario, expected_calls, built", [
    ({"local": True}, ["info", "image", "build"], True),  # the engine holds the tag: no registry needed
    ({"pull": "pulled"}, ["info", "image", "pull", "build"], True),
    ({"pull": "missing"}, ["info", "image", "pull"], False),
    ({"pull": "offline"}, ["info", "image", "pull"], False),  # cannot tell: no build that would fail later
    ({"info": 1}, ["info"], False),  # no engine answers
])
def test_the_build_starts_only_from_a_base_image_the_engine_holds_or_pulls(tmp_path, monkeypatch, scenario,
                                                                            expected_calls, built):
    log = fake_docker(tmp_path, monkeypatch, **scenario)
    context = tmp_path / "serving"
    context.mkdir()
    result = serving.build_image(str(context), "stoke", 3, BASE)
    assert result["built"] is built and calls(log) == expected_calls, result
    if scenario.get("pull") == "offline":
        assert result["reason"] == f"cannot pull {BASE}, the base of the serving image: Error response from daemon: " \
                                   "Get https://registry-1.docker.io/v2/: dial tcp: lookup registry-1.docker.io: no such host"


@pytest.mark.parametrize("written", [
    {"commands": {"docker_build": "/bin/sh -c 'id > {proof}'"}},  # any program at all
    {"commands": {"docker_build": "docker build -t example.com/other:latest -f {proof} /"}},  # docker, elsewhere
    {"serving_uri": "{proof}", "commands": {"docker_build": "docker build -t stoke-serving-stoke:1 {proof}"}},
])
def test_a_retry_builds_the_context_it_rendered_never_a_command_read_back_from_root(trained_runs, tmp_path,
                                                                                   monkeypatch, written):
    """commands.json holds the commands as text for the user: a push that finds its run already pushed (a
    retry) builds from an argument list of its own, ROOT/serving and the newest version, whatever that file says."""
    import json

    from tests.components.gate_runs import copy_root, push_run

    root = copy_root(trained_runs, tmp_path)
    proof = tmp_path / "ran"
    rendered = os.path.join(root, "serving", "commands.json")
    record = json.load(open(rendered))
    for key, value in written.items():
        value = json.loads(json.dumps(value).replace("{proof}", str(proof)))
        record[key] = record[key] | value if isinstance(value, dict) else value
    json.dump(record, open(rendered, "w"))
    log = fake_docker(tmp_path, monkeypatch, local=True)

    code, summary = push_run(root, "mixed", "--build-image")

    newest = trained_runs["push"]["mixed"][1]["version"]
    context = os.path.join(root, "serving")
    assert code == 0 and summary["already_pushed"] and summary["image"] == {"built": True}, summary
    assert not proof.exists()
    assert open(log).read().splitlines()[-1] == f"build -t stoke-serving-stoke:{newest} {context}"
    assert summary["serving_uri"] == context
    assert summary["commands"]["docker_build"] == f"docker build -t stoke-serving-stoke:{newest} {context}"
    assert json.load(open(rendered))["commands"] == summary["commands"]  # the text, rendered again


def _tree(folder: str) -> dict[str, bytes]:
    """Every file under `folder` by its path there, read as `docker build` copies the context (a link as its text)."""
    found = {}
    for base, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(base, name)
            if os.path.islink(path):
                found[os.path.relpath(path, folder)] = ("link to " + os.readlink(path)).encode()
            elif name in names:
                found[os.path.relpath(path, folder)] = open(path, "rb").read()
    return found


def _swap_weights(mirror: str, repository: str, first: str, third: str) -> None:
    import shutil

    shutil.rmtree(os.path.join(mirror, third, "variables"))
    shutil.copytree(os.path.join(repository, first, "variables"), os.path.join(mirror, third, "variables"))


def _flip_bytes(mirror: str, repository: str, first: str, third: str) -> None:
    path = os.path.join(mirror, third, "variables", "variables.data-00000-of-00001")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2:len(data) // 2 + 8] = b"\xde\xad\xbe\xef" * 2
    os.remove(path)  # a copy of its own, not the repository's file through a hard link
    open(path, "wb").write(bytes(data))


def _extra_file(mirror: str, repository: str, first: str, third: str) -> None:
    open(os.path.join(mirror, third, "saved_model.pbtxt"), "w").write("meta_graphs {}")


def _missing_file(mirror: str, repository: str, first: str, third: str) -> None:
    os.remove(os.path.join(mirror, third, "variables", "variables.index"))


def _version_linked(mirror: str, repository: str, first: str, third: str) -> None:
    import shutil

    shutil.rmtree(os.path.join(mirror, third))
    os.symlink(os.path.join(repository, first), os.path.join(mirror, third))


def _file_linked(mirror: str, repository: str, first: str, third: str) -> None:
    path = os.path.join(mirror, third, "saved_model.pb")
    os.remove(path)
    os.symlink(os.path.join(repository, third, "saved_model.pb"), path)  # the same bytes, through a link


def _model_folder_linked(mirror: str, repository: str, first: str, third: str) -> None:
    import shutil

    shutil.rmtree(mirror)
    os.symlink(repository, mirror)  # rendering into it would remove what the repository keeps beside its versions


@pytest.mark.parametrize("tamper, said", [
    (_swap_weights, "mirrored version {third} again (variables/variables.data-00000-of-00001 differs from the version's)"),
    (_flip_bytes, "mirrored version {third} again (variables/variables.data-00000-of-00001 differs from the version's)"),
    (_extra_file, "mirrored version {third} again (saved_model.pbtxt is not the version's)"),
    (_missing_file, "mirrored version {third} again (variables/variables.index is missing)"),
    (_version_linked, "mirrored version {third} again (it is a symbolic link)"),
    (_file_linked, "mirrored version {third} again (saved_model.pb is a symbolic link)"),
    (_model_folder_linked, "replaced the link {mirror} by a folder, mirrored version {first}, mirrored version {third}"),
])
def test_a_render_mirrors_again_a_version_that_differs_from_the_repository(trained_runs, tmp_path, tamper, said, caplog):
    """ROOT/serving/models/<name>/<version> is what `docker build ROOT/serving` ships: each render checks it
    against the version it mirrors (each file's size and SHA-256, or its inode when it is a hard link to the
    version's file) and mirrors it again when it differs, whatever was put there."""
    import shutil

    from tests.components.gate_runs import copy_root, push_run

    root = copy_root(trained_runs, tmp_path)
    first, third = (str(trained_runs["push"][run][1]["version"]) for run in ("good", "mixed"))
    repository, mirror = os.path.join(root, "models", "stoke"), os.path.join(root, "serving", "models", "stoke")
    open(os.path.join(repository, "notes.txt"), "w").write("the operator's, not Stoke's")
    shutil.rmtree(mirror)
    serving.render(root, "stoke")  # on one disk: hard links to the repository's files
    linked = {name: os.stat(os.path.join(mirror, third, name)).st_ino for name in ("saved_model.pb", "variables")}
    assert os.stat(os.path.join(repository, third, "saved_model.pb")).st_ino == linked["saved_model.pb"]
    assert serving.render(root, "stoke")["changed"] == []  # the same: nothing copied again
    assert {n: os.stat(os.path.join(mirror, third, n)).st_ino for n in linked} == linked

    tamper(mirror, repository, first, third)
    code, retried = push_run(root, "mixed")  # a retry renders the context again

    said = said.format(first=first, third=third, mirror=mirror)
    assert code == 0 and retried["message"].endswith(f"finished what it left undone: rendered {root}/serving: {said}")
    # The lineage is written without credentials, a copy of its own; the gate's answers stay in the repository.
    own = {os.path.join("assets.extra", name) for name in ("stoke_lineage.json", "stoke_answers.json.gz")}
    for version in (first, third):
        want, have = _tree(os.path.join(repository, version)), _tree(os.path.join(mirror, version))
        assert {k: v for k, v in have.items() if k not in own} == {k: v for k, v in want.items() if k not in own}
    assert not os.path.islink(mirror) and not os.path.islink(os.path.join(mirror, third))
    assert open(os.path.join(repository, "notes.txt")).read() == "the operator's, not Stoke's"
    assert sorted(os.listdir(mirror)) == sorted([first, third])
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [f"{mirror}: {said.split(', ')[0]}"]


def test_a_mirror_on_a_bucket_is_checked_by_size_and_sha256(trained_runs, tmp_path, s3_bucket):
    """An object store has no hard links: the mirror's files are compared with the version's by size and
    SHA-256, a changed file of the same size included."""
    from components.common.files import filesystem
    from components.common.repository import Repository

    version = trained_runs["push"]["mixed"][1]["version"]
    local = os.path.join(trained_runs["root"], "models", "stoke", str(version))
    lineage = os.path.join(local, "assets.extra", "stoke_lineage.json")
    root = f"s3://{s3_bucket}/root"
    Repository(root, "stoke").publish(local, version, {"assets.extra/stoke_lineage.json": open(lineage, "rb").read()})
    serving.render(root, "stoke")
    fs, mirror = filesystem(f"{root}/serving/models/stoke/{version}")
    weights = f"{mirror}/variables/variables.data-00000-of-00001"
    data = bytearray(fs.cat_file(weights))
    data[len(data) // 2:len(data) // 2 + 8] = b"\xde\xad\xbe\xef" * 2
    fs.pipe_file(weights, bytes(data))
    assert serving.render(root, "stoke")["changed"] == [
        f"mirrored version {version} again (variables/variables.data-00000-of-00001 differs from the version's)"]
    assert fs.cat_file(weights) == open(os.path.join(local, "variables", "variables.data-00000-of-00001"), "rb").read()
    assert serving.render(root, "stoke")["changed"] == []
