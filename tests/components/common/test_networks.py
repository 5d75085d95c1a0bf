"""A network enters training one way (components/common/networks.py): a function of the classes, the image size
and the weights returning a Keras model from uint8 images to logits. The examples keep the contract, with float32
logits under mixed precision; keras.applications' networks come by name with their own preprocessing; a network
is known by its identity and the SHA-256 of its code; and a file reference stays in its configuration's folder."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from components.common import network_code, networks

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples" / "networks"


@pytest.fixture
def mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("example, backbone", [("residual", None), ("backbone_head", "MobilenetV3small")])
def test_the_examples_keep_the_contract_with_float32_logits_under_mixed_precision(mixed_bfloat16, example, backbone):
    code = networks.load(f"{EXAMPLES / example}.py:network")
    model = networks.build(code, 3, 32, None)
    assert (model.inputs[0].dtype, model.inputs[0].shape.as_list()) == (tf.uint8, [None, 32, 32, 3])
    # Their last Dense names no dtype: under mixed_bfloat16 Stoke rebuilt it in float32, weights and all.
    assert model.layers[-1].compute_dtype == "float32" and model.outputs[0].dtype == tf.float32
    logits = model(np.full((2, 32, 32, 3), 255, np.uint8), training=False)
    assert logits.shape == (2, 3) and logits.dtype == tf.float32
    assert getattr(networks.backbone(model), "name", None) == backbone


def test_keras_applications_come_by_name_with_their_own_preprocessing(mixed_bfloat16):
    code = networks.load("keras.applications.MobileNetV2")
    assert code.identity == "keras.applications.MobileNetV2" and code.files == ()  # Keras' code: no copy to keep
    model = networks.build(code, 4, 32, None)
    pixels = np.zeros((1, 32, 32, 3), np.uint8)
    pixels[0, 0, 0] = [0, 128, 255]
    scaled = keras.Model(model.inputs, model.get_layer("preprocess").output)(pixels)
    np.testing.assert_allclose(np.asarray(scaled, np.float32)[0, 0, 0], [-1, 0.0039, 1], atol=0.01)  # MobileNetV2's
    assert networks.backbone(model).name.startswith("mobilenetv2") and model.outputs[0].dtype == tf.float32
    with pytest.raises(networks.NetworkError, match="^train.network keras.applications.MobileNetV9: keras.applications "
                                                    "has no network MobileNetV9$"):
        networks.load("keras.applications.MobileNetV9")


def test_a_network_is_known_by_its_identity_and_the_sha256_of_its_code(tmp_path, monkeypatch):
    source = EXAMPLES / "residual.py"
    here, there = tmp_path / "here", tmp_path / "there" / "nets"
    for folder in (here, there):
        folder.mkdir(parents=True)
        shutil.copy(source, folder / "residual.py")
    first, copy = networks.load(f"{here}/residual.py:network"), networks.load(f"{there}/residual.py:network")
    # A copy elsewhere is the same network: what `sha256sum residual.py` prints.
    assert (first.identity, first.digest) == (copy.identity, copy.digest) == (
        "residual.py:network", hashlib.sha256(source.read_bytes()).hexdigest())
    with open(there / "residual.py", "a") as f:
        f.write("# an edit\n")
    assert networks.load(f"{there}/residual.py:network").digest != first.digest
    assert first.files == (("residual.py", source.read_bytes()),)  # what a run keeps in code/

    # A module's network is its package's files: an edit of a module it imports changes its digest too.
    package = tmp_path / "path" / "mynets"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "blocks.py").write_text("WIDTH = 8\n")
    (package / "net.py").write_text(f"from mynets.blocks import WIDTH\n{source.read_text()}")
    monkeypatch.syspath_prepend(str(tmp_path / "path"))
    module = networks.load("mynets.net:network")
    assert module.identity == "mynets.net:network"
    assert [name for name, _ in module.files] == ["mynets/__init__.py", "mynets/blocks.py", "mynets/net.py"]
    (package / "blocks.py").write_text("WIDTH = 16\n")
    assert networks.load("mynets.net:network").digest != module.digest
    # Stoke's own: a built-in network is known by its name, and its digest is that of Stoke's file of them.
    assert [networks.load(name).identity for name in ("small_cnn", "resnet50")] == ["small_cnn", "resnet50"]


def _config_show(capsys, folder: pathlib.Path, network: str) -> tuple[int, str, str]:
    from flows.cli import main

    (folder / "run.yaml").write_text(json.dumps({"train": {"network": network}}))
    code = main(["config", "show", "--config", str(folder / "run.yaml"), "--json"])
    return code, *capsys.readouterr()


def test_a_file_reference_is_found_beside_the_configuration_and_stays_in_its_folder(tmp_path, capsys, monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "nets").mkdir(parents=True)
    elsewhere.mkdir()
    shutil.copy(EXAMPLES / "residual.py", project / "nets" / "residual.py")
    shutil.copy(EXAMPLES / "residual.py", elsewhere / "outside.py")
    (project / "nets" / "link.py").symlink_to(elsewhere / "outside.py")
    (project / "nets" / "inside.py").symlink_to(project / "nets" / "residual.py")
    monkeypatch.chdir(elsewhere)  # the configuration's folder counts, not the working one

    code, out, _ = _config_show(capsys, project, "nets/inside.py:network")  # a link that stays inside: its real path
    assert code == 0
    shown = json.loads(out.strip().splitlines()[-1])["train"]["network"]
    assert shown == f"{os.path.realpath(project / 'nets' / 'residual.py')}:network"
    for network, says in [
            ("../elsewhere/outside.py:network", "../elsewhere/outside.py leaves the configuration's folder ('..')"),
            ("nets/../../elsewhere/outside.py:network", "leaves the configuration's folder ('..')"),
            (f"{elsewhere}/outside.py:network", f"{elsewhere}/outside.py is not beside the run configuration"),
            ("file:///etc/outside.py:network", "file:///etc/outside.py is not beside the run configuration"),
            ("nets/link.py:network", f"train.network nets/link.py:network: nets/link.py leads out of {project}"),
            ("nets/missing.py:network", f"no such file {project}/nets/missing.py"),
            ("nets/residual.txt:network", "not a network: name a built-in network")]:
        code, _, err = _config_show(capsys, project, network)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in err, (network, err)

    # A stage program reads its --config the same way, before it reads anything else.
    from components.train import trainer

    (project / "out.yaml").write_text(json.dumps({"train": {"network": "nets/link.py:network"}}))
    assert trainer.run(["--config", str(project / "out.yaml"), "--root", str(tmp_path / "root"), "--json"]) == 2
    assert "leads out of" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert not (tmp_path / "root").exists()


def test_a_run_records_a_file_network_by_its_copy_beside_its_config(tmp_path):
    from components.common.files import write_whole
    from components.contracts.layout import Root
    from components.contracts.run_config import RunConfig

    located = network_code.locate("networks/residual.py:network", str(EXAMPLES.parent))
    run = Root(str(tmp_path)).run("r")
    recorded, files = network_code.for_run(RunConfig(root=str(tmp_path), train={"network": located}), run)
    assert recorded.train.network == "code/residual.py:network"
    assert files == {f"{run.code}/residual.py": (EXAMPLES / "residual.py").read_bytes()}
    for uri, data in files.items():
        write_whole(uri, data)
    # config.json names the copy, which the stages that read it find beside it.
    assert network_code.locate(recorded.train.network, run.uri) == f"{run.code}/residual.py:network"
