"""Preflight tries the run's network before any data is read: its code imported or run, the network built for the
run's classes and size, one batch through it on the CPU. A network that cannot be had is one line naming its
reference, and a settings problem: `stoke preflight` exits 2."""
from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from components.preflight import preflight

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "networks" / "residual.py"
HEAD = "import tf_keras as keras\n\n\ndef network(num_classes, image_size, weights):\n"
INPUT = "    inputs = keras.Input((image_size, image_size, 3), dtype='uint8')\n"
POOLED = "    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Rescaling(1 / 255)(inputs))\n"
FILES = {
    "dict.py": HEAD + "    return {'logits': num_classes}\n",
    "wrong_width.py": HEAD + INPUT + POOLED + "    return keras.Model(inputs, keras.layers.Dense(10)(x))\n",
    "float_input.py": HEAD + "    inputs = keras.Input((image_size, image_size, 3))\n" + POOLED
    + "    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n",
    "float16_logits.py": HEAD + INPUT + POOLED
    + "    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype='float16', name='logits')(x))\n",
    "subclassed.py": "import tf_keras as keras\n\n\nclass Net(keras.Model):\n    def __init__(self, n):\n"
    "        super().__init__()\n        self.dense = keras.layers.Dense(n)\n\n    def call(self, x):\n"
    "        return self.dense(keras.layers.Flatten()(x))\n\n\ndef network(num_classes, image_size, weights):\n"
    "    return Net(num_classes)\n",
    "broken.py": "def network(:\n",
    "imports_broken.py": "import stoke_no_such_package\n",
}

CASES = [  # (train settings, what the one line says after "train.network <reference>")
    ({"network": "stoke_no_such_network:network"},
     ": module stoke_no_such_network does not import (ModuleNotFoundError: No module named 'stoke_no_such_network')"),
    ({"network": "imports_broken:network"},
     ": module imports_broken does not import (ModuleNotFoundError: No module named 'stoke_no_such_package')"),
    ({"network": "nets/broken.py:network"}, "broken.py does not run (SyntaxError: "),
    ({"network": "nets/residual.py:resnet"}, "residual.py has no function resnet"),
    ({"network": "nets/dict.py:network"}, " returned dict, not a Keras model"),
    ({"network": "nets/wrong_width.py:network"}, " returns float32 [None, 10] for 2 classes: one logit a class, [N, 2]"),
    ({"network": "nets/float_input.py:network"},
     " takes float32 [None, 32, 32, 3]: Stoke hands it uint8 images [N, 32, 32, 3]; start it with keras.Input"),
    ({"network": "nets/float16_logits.py:network"},
     ": its last layer logits keeps its weights in float16, so its logits cannot be made float32; give it "
     "dtype='float32'"),
    ({"network": "nets/subclassed.py:network"}, " takes no keras.Input (a subclassed model)"),
    ({"network": "nets/residual.py:network", "weights": "imagenet"},
     ": building it failed (ValueError: residual.py trains from scratch: set train.weights to none)"),
    ({"network": "nets/residual.py:network", "weights": "/nowhere/w.h5"}, ": train.weights /nowhere/w.h5: no such local file"),
    ({"network": "keras.applications.ResNet42"}, ": keras.applications has no network ResNet42"),
]


@pytest.mark.parametrize("train, says", CASES, ids=[c[0]["network"] + c[0].get("weights", "") for c in CASES])
def test_a_network_that_cannot_be_had_is_one_line_and_a_settings_problem(train, says, tmp_path, capsys, monkeypatch):
    nets = tmp_path / "nets"
    nets.mkdir()
    shutil.copy(EXAMPLE, nets / "residual.py")
    for name, text in FILES.items():
        (nets / name).write_text(text)
    monkeypatch.syspath_prepend(str(nets))  # where a module network is imported from
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"preflight": {"sample_mb": 1},
                                  "train": {"image_size": 32, "weights": "none", "precision": "mixed_bfloat16", **train}}))
    code = preflight.run(["--config", str(config), "--root", str(tmp_path / "root"), "--json"])
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    named = train["network"].removeprefix("nets/")  # a file network is known by its file's name
    assert lines[0].startswith(f"stoke preflight: network failed: train.network {named}"), lines[0]
    assert says in lines[0], lines[0]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["failed"] == ["network"] and report["checks"][0]["name"] == "network"
