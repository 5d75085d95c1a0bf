"""The training recipe's parts on their own: the schedule, the weight average, the small-data batch."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from components.train import recipe
from components.train.trainer import default_batch, short_run_warnings


def test_warmup_rises_linearly_then_cosine_decays_to_near_zero():
    schedule = recipe.WarmupCosine(peak=0.01, warmup=10, total=110)
    rates = [float(schedule(step)) for step in range(120)]
    np.testing.assert_allclose(rates[:10], [0.001 * (s + 1) for s in range(10)], rtol=1e-5)
    assert rates[10] == pytest.approx(0.01)
    assert rates[60] == pytest.approx(0.01 * (recipe.FINAL_FRACTION + (1 - recipe.FINAL_FRACTION) / 2), rel=1e-5)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))
    assert rates[110] == rates[119] == pytest.approx(0.01 * recipe.FINAL_FRACTION)


def test_warmup_is_capped_on_short_runs_and_absent_without_a_schedule():
    assert recipe.warmup_steps(1.0, 50, 400) == 50
    assert recipe.warmup_steps(1.0, 50, 100) == 20  # a fifth of the run at most
    assert recipe.learning_rate("constant", 0.001, 0, 100) == 0.001


def test_the_default_batch_shrinks_for_small_splits_and_short_runs_warn():
    assert default_batch(100_000, 1) == 64
    assert default_batch(1_622, 1) == 64  # 25 steps per epoch
    assert default_batch(900, 1) == 32
    assert default_batch(218, 1) == default_batch(48, 1) == 16
    assert default_batch(900, 2) == 16
    assert "only 120 training steps" in short_run_warnings(120, "none")[0]
    assert short_run_warnings(120, "imagenet") == short_run_warnings(400, "none") == []


def _fit(callbacks=(), epochs=2):
    keras.utils.set_random_seed(3)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile(recipe.make_optimizer(0.05, 1e-4, 0.9), recipe.make_loss(2, 0.1), metrics=["accuracy"])
    history = model.fit(x, y, batch_size=8, epochs=epochs, validation_data=(x, y), verbose=0, callbacks=list(callbacks))
    return model, history.history, (x, y)


class _RawWeights(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.raw = [v.numpy() for v in self.model.trainable_variables]


def test_validation_and_the_end_of_fit_see_the_average_not_the_raw_weights():
    raw = _RawWeights()
    model, history, (x, y) = _fit([recipe.EmaEvaluation(), raw])
    pairs = recipe.average_pairs(model)
    assert len(pairs) == len(model.trainable_variables)
    for variable, average in pairs:
        np.testing.assert_array_equal(variable.numpy(), average.numpy())
    assert any(not np.allclose(r, v.numpy()) for r, v in zip(raw.raw, model.trainable_variables))
    # What the last epoch's validation reported is what the weights after fit give.
    loss, _ = model.evaluate(x, y, batch_size=8, verbose=0)
    assert history["val_loss"][-1] == pytest.approx(loss, rel=1e-5)


def test_the_average_warms_up_instead_of_holding_the_initialisation():
    optimizer = recipe.make_optimizer(0.0, 0.0, 0.99)  # rate 0: the weights stay where they start
    variable = tf.Variable([1.0])
    optimizer.build([variable])
    variable.assign([5.0])
    optimizer.apply_gradients([(tf.constant([0.0]), variable)])
    value = float(optimizer._model_variables_moving_average[0].numpy()[0])
    assert value == pytest.approx(0.1 * 1.0 + 0.9 * 5.0)  # momentum min(0.99, 1/10) at step 0
