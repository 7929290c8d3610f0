"""Decoupled weight decay: each update also takes rate x decay x the weight
away, from the weights of two or more dimensions only; biases and
normalisation scales and offsets keep what the gradient gives them."""

import io

import keras
import numpy as np
import pytest
from conftest import flag_message

import towers
from engine.core import variables as variables_lib
from engine.errors import UsageError


def one_step(weight_decay):
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], optimizer="sgd", learning_rate=0.1,
                             batch_size=32, seed=4, weight_decay=weight_decay,
                             stream=io.StringIO())
    trainer.evaluate(steps=1)  # builds the towers
    before = [v.numpy() for v in trainer.model.trainable_variables]
    trainer.fit(epochs=1, steps_per_epoch=1, eval_steps=0, verbose=2)
    after = [v.numpy() for v in trainer.model.trainable_variables]
    return before, after, trainer


@pytest.mark.slow
def test_decay_takes_rate_times_decay_times_the_weight_from_kernels_only():
    before, plain, _ = one_step(0.0)
    same_before, decayed, trainer = one_step(0.5)
    shapes = [w.shape for w in before]
    assert [len(s) for s in shapes] == [2, 1, 2, 1]  # the mlp: kernel, bias, kernel, bias
    for start, other_start in zip(before, same_before):
        np.testing.assert_array_equal(start, other_start)  # the same seed, the same start
    for start, a, b, shape in zip(before, plain, decayed, shapes):
        want = -0.1 * 0.5 * start if len(shape) >= 2 else np.zeros(shape)
        np.testing.assert_allclose(b - a, want, rtol=1e-3, atol=1e-7)
    header = trainer.stream.getvalue()
    assert ("weight decay 0.5 (decoupled) on 2 of 4 variables, none on biases and "
            "normalisation scales and offsets (1-D)") in header


def test_the_rule_leaves_out_normalisation_scales_and_offsets():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1, weight_decay=0.1)
    variables_lib.exclude_from_decay(optimizer, model)
    optimizer.build(model.trainable_variables)
    used = [optimizer._use_weight_decay(v) for v in model.trainable_variables]
    assert used == [True, False, False, False, True, False]  # kernel, bias, gamma, beta, ...
    assert variables_lib.decayed(model) == (2, 6)


@pytest.mark.parametrize("arguments, message", [
    ({"weight_decay": -1.0}, "--weight-decay (-1.0) must be 0 or more (1e-4 and 5e-5 are the "
     "ResNet-50 recipes')"),
    ({"weight_decay": 1e-4, "optimizer": lambda: keras.optimizers.SGD(0.1)},
     "--weight-decay is for a named optimizer; give your own optimizer its weight_decay "
     "itself"),
])
def test_a_bad_decay_is_refused_in_one_line(arguments, message):
    with pytest.raises(UsageError) as err:
        towers.Trainer(["/cpu:0"], **arguments)
    assert flag_message(err.value) == message
