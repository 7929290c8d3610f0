"""The papers' variants of the compressing reducers: top-k and signSGD with
error feedback off (their ablations) and top-k with Deep Gradient
Compression's momentum correction, each held to a numpy reference."""

import numpy as np
import pytest
import tensorflow as tf
from test_stateful import built

from engine.reducers import ReducerError, ReducerOptions
from towers.reducers import SignSGD, TopK

TWO = ["/cpu:0", "/cpu:1"]
STEPS = np.random.default_rng(3).normal(size=(3, 2, 10)).astype(np.float32)  # step, tower, v


def run(reducer, steps=STEPS):
    call = built(reducer, [tf.TensorShape([10])], devices=TWO)
    return [call([[tf.constant(g)] for g in step])[0][0].numpy() for step in steps]


def top(x, k):
    kept = np.zeros_like(x)
    at = np.argsort(-np.abs(x), kind="stable")[:k]
    kept[at] = x[at]
    return kept


def test_without_feedback_each_step_sends_only_its_own_gradient():
    plain = run(TopK(ratio=0.2, feedback=False))
    for step, result in zip(STEPS, plain):
        np.testing.assert_allclose(result, np.mean([top(g, 2) for g in step], axis=0),
                                   rtol=1e-6)
    signs = run(SignSGD(feedback=False))
    for step, result in zip(STEPS, signs):
        scaled = [np.abs(g).mean() * np.where(g >= 0, 1.0, -1.0) for g in step]
        np.testing.assert_allclose(result, np.mean(scaled, axis=0), rtol=1e-6)
    assert SignSGD(feedback=False).variables == ()  # nothing kept, nothing saved


def test_with_feedback_the_second_step_carries_what_the_first_left_out():
    with_feedback, without = run(TopK(ratio=0.2)), run(TopK(ratio=0.2, feedback=False))
    np.testing.assert_allclose(with_feedback[0], without[0], rtol=1e-6)
    residual = [g - top(g, 2) for g in STEPS[0]]
    second = np.mean([top(g + r, 2) for g, r in zip(STEPS[1], residual)], axis=0)
    np.testing.assert_allclose(with_feedback[1], second, rtol=1e-6)
    assert not np.allclose(with_feedback[1], without[1])


def test_momentum_correction_is_dgcs_algorithm():
    """Lin et al., Algorithm 2 with factor masking: u = m u + g, a = a + u,
    send top-k of a, zero u and a where sent."""
    m, k = 0.9, 3
    u, a, expected = np.zeros((2, 10)), np.zeros((2, 10)), []
    for step in STEPS:
        sent = []
        for t, g in enumerate(step):
            u[t] = m * u[t] + g
            a[t] = a[t] + u[t]
            kept = top(a[t], k)
            mask = kept != 0
            u[t][mask], a[t][mask] = 0, 0
            sent.append(kept)
        expected.append(np.mean(sent, axis=0))
    reducer = TopK(ratio=0.3, momentum=m)
    for got, want in zip(run(reducer), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert {v.name.split("/")[-1].split(":")[0] for v in reducer.variables} == {
        "velocity", "accumulated"}
    assert not hasattr(reducer, "residuals")  # owed to the velocities, not the gradients


def test_the_variants_are_spelled_in_the_reducer_spec():
    assert ReducerOptions(name="signsgd:feedback=false").arguments == {"feedback": False}
    assert ReducerOptions(name="topk:ratio=0.001,momentum=0.9").arguments == {
        "ratio": 0.001, "momentum": 0.9}
    with pytest.raises(ReducerError) as bad:
        ReducerOptions(name="signsgd:feedback=maybe")
    assert str(bad.value) == ("reducer 'signsgd:feedback=maybe': feedback='maybe' is not "
                              "true or false; e.g. signsgd:feedback=true")
    with pytest.raises(ReducerError) as bad:
        ReducerOptions(name="topk:momentum=0.9,feedback=false")
    assert "momentum=0.9 accumulates what was not sent, which is error feedback" in str(
        bad.value)
    with pytest.raises(ReducerError, match=r"momentum \(1.0\) must be in \[0, 1\)"):
        ReducerOptions(name="topk:momentum=1")
