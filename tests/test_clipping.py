"""Gradient clipping by global norm, after the reduction: the update is the
clipped mean, every copy applies the same one, and the norm before clipping
is reported; bad norms are refused in one line."""

import io

import numpy as np
import pytest
from conftest import flag_message

import towers
from engine.errors import UsageError


class Norms(towers.callbacks.Callback):
    def __init__(self):
        self.logs = []

    def on_train_batch_end(self, batch, logs):
        self.logs.append(logs)


def one_sgd_step(clip_norm=None, variables="reduce-device"):
    """The gradient one SGD step applied (from the weights before and
    after), and the step's logs."""
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], optimizer="sgd", learning_rate=0.1,
                             batch_size=32, seed=4, clip_norm=clip_norm, variables=variables,
                             stream=io.StringIO())
    trainer.evaluate(steps=1)  # builds the towers
    before = [v.numpy() for v in trainer.model.trainable_variables]
    norms = Norms()
    trainer.fit(epochs=1, steps_per_epoch=1, eval_steps=0, callbacks=[norms], verbose=0)
    after = [v.numpy() for v in trainer.model.trainable_variables]
    applied = [(b - a) / 0.1 for b, a in zip(before, after)]
    return applied, norms.logs[0], trainer


def global_norm(arrays):
    return float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays)))


@pytest.mark.slow
def test_the_update_is_the_mean_clipped_to_the_norm_and_the_norm_before_is_reported():
    plain, plain_logs, _ = one_sgd_step()
    clipped, logs, _ = one_sgd_step(clip_norm=0.01)
    norm = global_norm(plain)
    assert norm > 0.1  # clipping to 0.01 does act
    assert "grad_norm" not in plain_logs
    np.testing.assert_allclose(logs["grad_norm"], norm, rtol=1e-4)
    np.testing.assert_allclose(global_norm(clipped), 0.01, rtol=1e-3)
    for got, want in zip(clipped, plain):
        # Weights minus weights in float32: the step is known to 1e-7 or so.
        np.testing.assert_allclose(got, want * 0.01 / norm, rtol=1e-3, atol=1e-7)
    # A norm above the gradient's leaves it as it is.
    loose, loose_logs, _ = one_sgd_step(clip_norm=1e6)
    for got, want in zip(loose, plain):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_replicated_copies_apply_the_same_clipped_mean():
    _, logs, trainer = one_sgd_step(clip_norm=0.01, variables="replicated")
    assert logs["grad_norm"] > 0.01
    assert trainer.built.step.variables.check(0.0, 1) == 0.0


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_a_norm_that_is_not_a_positive_number_is_refused(value):
    with pytest.raises(UsageError) as err:
        towers.Trainer(["/cpu:0"], clip_norm=value)
    assert flag_message(err.value) == f"--clip-norm ({value}) must be a positive number"
