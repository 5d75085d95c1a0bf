"""metrics.json says when a run learned nothing: eval accuracy at the eval split's majority share, epoch
after epoch, while train accuracy rose; with the likely cause and the fix for the run's settings."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from components.train import trainer
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span
from tests.components.train.test_train import TINY

# 19 eval records, 7 of class 0: a model that answers any one class scores 7/19 or 6/19, within a record.
EVAL_LABELS = [0] * 7 + [1] * 6 + [2] * 6


def history(val, train):
    return {"val_accuracy": val, "accuracy": train}


@pytest.mark.parametrize("val, train, flat", [
    ([7 / 19, 7 / 19, 6 / 19, 7 / 19], [0.4, 0.7, 0.9, 1.0], True),  # at the majority's share, within a record
    ([7 / 19, 9 / 19, 12 / 19, 15 / 19], [0.4, 0.7, 0.9, 1.0], False),  # it learned
    ([7 / 19, 7 / 19, 7 / 19], [0.36, 0.37, 0.38], False),  # nothing rose: an unlearnable set, not memorised
    ([5 / 19, 5 / 19, 5 / 19], [0.4, 0.8, 1.0], False),  # flat, but below the majority: another story
    ([7 / 19], [1.0], False),  # one epoch says nothing about a trend
])
def test_flat_at_the_majority_while_train_rises(val, train, flat):
    read = []
    found = trainer.learned_nothing(history(val, train), 19, lambda: read.append(1) or EVAL_LABELS)
    assert found == ((0, 7) if flat else None)
    assert read == ([1] if len(val) > 1 and max(val) - min(val) <= 2 / 19 else [])  # read only when eval is flat


def _constant_image() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((32, 40, 3), 128, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_run_that_learned_nothing_says_so_with_the_fix(tmp_path, capsys):
    """The training images are learnable, the eval images all one grey picture: whatever the model
    learned, it answers them all the same, so eval accuracy stays at a class's share."""
    root = str(tmp_path / "root")
    grey = _constant_image()
    write_span(root, 1, {"train": tiny_records(48), "eval": [(grey, "png", label) for label in EVAL_LABELS]},
               TRAIN_LABELS, {"train": 2, "eval": 1})
    code = trainer.run(["--root", root, *TINY, "--run-id", "flat", "--epochs", "4", "--seed", "1",
                      "--input-probe-steps", "0", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["history"]["accuracy"][-1] > 0.6  # it learned the training images
    flat = [w for w in summary["warnings"] if w.startswith("eval accuracy stayed at")]
    assert len(flat) == 1, summary["warnings"]
    assert "the share of the eval split's most common class (red: 7 of 19)" in flat[0]
    assert "about 16 training images a class" in flat[0] and "more images a class" in flat[0]
    assert "more steps (train.min_steps, or train.epochs)" in flat[0]  # small_cnn from scratch


def test_the_advice_follows_the_settings():
    from components.common.advice import causes_and_fixes, in_words

    scratch = in_words(*causes_and_fixes("efficientnet_b0", "none", 37))
    assert "efficientnet_b0 trained from scratch" in scratch and "about 37 training images a class" in scratch
    assert "train.weights: imagenet" in scratch
    assert "`--preset cpu` (small_cnn from scratch at 64 px, at least 600 steps: minutes on a CPU)" in scratch
    pretrained = in_words(*causes_and_fixes("efficientnet_b0", "imagenet", 500))
    assert "from scratch" not in pretrained and "train.head_epochs" in pretrained
    assert "train.fine_tune_learning_rate" in pretrained
