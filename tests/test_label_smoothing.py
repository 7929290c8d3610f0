"""Label smoothing of the default loss: the value against the formula, on
probabilities and on logits, per sample and per position; one-line refusals."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import flag_message

import towers
from engine.core.losses import per_sample
from engine.errors import UsageError


def by_hand(probs, labels, smoothing):
    """-sum over classes of the smoothed target times log p."""
    k = probs.shape[-1]
    target = np.full(probs.shape, smoothing / k)
    target[np.arange(len(labels)), labels] += 1.0 - smoothing
    return -(target * np.log(probs)).sum(axis=-1)


def test_the_smoothed_loss_is_the_formula_on_probabilities_and_logits():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    labels = np.array([0, 1])
    want = by_hand(probs, labels, 0.1)  # 0.4733..., 2.1316...
    got = per_sample(None, label_smoothing=0.1)(tf.constant(labels),
                                                 tf.constant(probs, tf.float32))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
    logits = np.log(probs) + 3.0  # the same softmax
    got = per_sample(None, from_logits=True, label_smoothing=0.1)(
        tf.constant(labels), tf.constant(logits, tf.float32))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
    plain = per_sample(None)(tf.constant(labels), tf.constant(probs, tf.float32))
    np.testing.assert_allclose(plain.numpy(), -np.log([0.7, 0.1]), rtol=1e-5)
    assert (got.numpy() > plain.numpy()).tolist() == [True, False]  # the confident wrong one


def test_per_position_labels_are_smoothed_and_averaged_per_sample():
    probs = np.array([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]])  # one sample, two positions
    labels = np.array([[0, 1]])
    got = per_sample(None, label_smoothing=0.2)(tf.constant(labels),
                                                 tf.constant(probs, tf.float32))
    np.testing.assert_allclose(got.numpy(), [by_hand(probs[0], labels[0], 0.2).mean()],
                               rtol=1e-5)


@pytest.mark.parametrize("arguments, message", [
    ({"label_smoothing": 1.0}, "--label-smoothing (1.0) must be at least 0 and below 1 "
     "(0.1 is the ResNet-50 recipes')"),
    ({"label_smoothing": -0.1}, "--label-smoothing (-0.1) must be at least 0 and below 1 "
     "(0.1 is the ResNet-50 recipes')"),
    ({"label_smoothing": 0.1, "loss": lambda labels, outputs: outputs[:, 0]},
     "--label-smoothing smooths the default loss; give your own loss its smoothing itself"),
])
def test_a_bad_smoothing_is_refused_in_one_line(arguments, message):
    with pytest.raises(UsageError) as err:
        towers.Trainer(["/cpu:0"], **arguments)
    assert flag_message(err.value) == message
