"""--mixed-precision: bfloat16 and float16 towers, and float16's dynamic loss scale."""

import io
import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import digit_iterators, flag_message, run_cli

from engine.core import loop, precision
from engine.core.loss_scale import DynamicLossScale, next_scale
from engine.core.options import LoopOptions
from engine.core.progress import EpochProgress
from engine.core.step import TowerStep
from engine.core.variables import ReduceDeviceVariables
from engine.reducers.central import Central
from engine.run.guard import NonFiniteError, NonFiniteGuard
from engine.topology.devices import DeviceRequest, Placement, Tower, resolve
from towers import models

BATCH = 32
STEPS = 30
VISIBLE = [f"/cpu:{k}" for k in range(4)]


def make_step(compute_dtype, loss_scale=None, num_towers=2):
    """Two towers on /cpu:0 and /cpu:1, Adam; the same seed gives the same weights."""
    placement = resolve(DeviceRequest(tuple(VISIBLE[:num_towers])), VISIBLE)
    keras.utils.set_random_seed(5)

    def make_model():
        with precision.policy(compute_dtype):
            return models.mlp((28, 28, 1), 10, dropout=0.0)

    variables = ReduceDeviceVariables(
        make_model, lambda: keras.optimizers.Adam(2e-3), placement
    )
    return TowerStep(
        variables=variables, placement=placement, reducer=Central(placement.reduce_device),
        loss_scale=loss_scale(placement.reduce_device) if loss_scale else None,
    )


def tower_iterators(digits, step, steps=STEPS):
    return digit_iterators(digits, step.placement, steps, BATCH)


def train_losses(digits, step, steps=STEPS):
    iterators = tower_iterators(digits, step, steps)
    return [float(step.train(iterators).loss) for _ in range(steps)]


@pytest.fixture(scope="module")
def float32_losses(digits):
    return train_losses(digits, make_step("float32"))


def test_policy_makes_layers_compute_in_bfloat16_with_float32_variables():
    step = make_step("bfloat16")
    dense = step.model.layers[1]
    assert (dense.compute_dtype, dense.variable_dtype) == ("bfloat16", "float32")
    assert {v.dtype for v in step.model.trainable_variables} == {"float32"}
    assert keras.config.dtype_policy().name == "float32"  # restored after building


@pytest.mark.slow
@pytest.mark.parametrize(
    "compute_dtype, loss_scale", [("bfloat16", None), ("float16", DynamicLossScale)]
)
def test_mixed_precision_tracks_float32(digits, float32_losses, compute_dtype, loss_scale):
    step = make_step(compute_dtype, loss_scale)
    losses = train_losses(digits, step)

    # Same weights, same data: the first steps differ only by rounding.
    np.testing.assert_allclose(losses[:10], float32_losses[:10], rtol=0.01)
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < 0.5 * first, losses
    assert last == pytest.approx(np.mean(float32_losses[-5:]), rel=0.1)
    assert int(step.skipped.numpy()) == 0
    if loss_scale:
        # As the model grows confident, an unlikely true class's gradient
        # (1/p, scaled) can overflow float16 now and then: a few steps skipped,
        # each halving the scale.
        overflows = int(step.loss_scale.overflows.numpy())
        assert overflows <= 3
        assert float(step.loss_scale.scale.numpy()) == 2.0**15 / 2**overflows


@pytest.mark.slow
def test_an_overflowing_loss_scale_halves_and_skips_until_it_fits(digits, tmp_path):
    initial = 2.0**30  # float16 overflows above 65504: the first steps must fail
    step = make_step("float16", lambda device: DynamicLossScale(device, initial=initial))
    guard = NonFiniteGuard(step.placement.devices, skip=False, warn=pytest.fail)
    iterators = tower_iterators(digits, step, steps=60)
    before = [v.numpy() for v in step.model.trainable_variables]

    scales, overflows, losses = [], [], []
    for n in range(1, 61):
        scales.append(float(step.loss_scale.scale.numpy()))
        outputs = step.train(iterators)
        guard.after_step(n, loop.per_step(outputs)[0])  # an overflow must not stop the run
        overflows.append(bool(outputs.overflow))
        losses.append(float(outputs.loss))
        if n == 1:
            assert not outputs.finite.numpy().any()  # both towers overflowed
            for old, new in zip(before, step.model.trainable_variables):
                np.testing.assert_array_equal(old, new.numpy())  # update skipped

    k = overflows.index(False)  # the first step that fits
    assert 5 <= k < 30, overflows
    assert overflows[:k] == [True] * k
    assert scales[: k + 1] == [initial / 2**i for i in range(k + 1)]
    assert int(step.loss_scale.overflows.numpy()) == sum(overflows)
    assert int(step.skipped.numpy()) == 0  # overflows are not counted as skipped
    assert int(step.global_step.numpy()) == 60
    assert int(step.sums.steps.numpy()) == 60 - sum(overflows)  # the steps that updated
    # Then training proceeds at a scale that fits, overflowing only now and then.
    assert sum(overflows[k:]) <= 0.15 * (60 - k), overflows
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[k : k + 5]), losses

    # The scale is part of the checkpoint: a new run restores where it got to.
    path = tf.train.Checkpoint(**step.trackables()).save(str(tmp_path / "ckpt"))
    fresh = make_step("float16", DynamicLossScale)
    tf.train.Checkpoint(**fresh.trackables()).restore(path).assert_existing_objects_matched()
    assert float(fresh.loss_scale.scale.numpy()) == float(step.loss_scale.scale.numpy())
    assert int(fresh.loss_scale.overflows.numpy()) == sum(overflows)


def test_an_epoch_of_only_overflows_shows_no_loss_and_counts_them(digits):
    # Found on the H200 (ResNet-50, float16): the first epoch's 5 steps all
    # overflowed and the line said "loss: 0.0000 - accuracy: 0.0000".
    step = make_step("float16", lambda device: DynamicLossScale(device, initial=2.0**30))
    iterators = tower_iterators(digits, step, steps=6)
    stream = io.StringIO()
    options = LoopOptions(epochs=2, steps_per_epoch=3, eval_steps=0)
    records = loop.run(step, iterators, options, EpochProgress(stream, interval=0))
    # Six steps run at scales 2**30 to 2**25, all too large for float16's
    # 65504 (the logit gradients alone pass it): both epochs only overflow.
    assert [(r["steps"], r["loss"], r["accuracy"]) for r in records] == [(0, None, None)] * 2
    assert [r["overflows"] for r in records] == [3, 6]
    ends = [line for line in stream.getvalue().splitlines() if "3/3" in line and "ms/step" in line]
    assert len(ends) == 2 and all("loss-scale overflows: 3" in line for line in ends), ends
    assert not any("loss:" in line or "skipped" in line for line in ends), ends


def test_a_non_finite_loss_still_stops_the_run():
    """The scale only answers for gradients it overflowed; a NaN loss is the guard's."""
    guard = NonFiniteGuard(["/cpu:0", "/cpu:1"], skip=False, warn=pytest.fail)
    outputs = {"finite": tf.constant([True, False]), "overflow": tf.constant(False)}
    with pytest.raises(NonFiniteError) as err:
        guard.after_step(7, outputs)
    assert re.search(r"^step 7: .* tower 1 \(/cpu:1\) is not finite", flag_message(err.value))
    guard.after_step(7, {**outputs, "overflow": tf.constant(True)})  # passes silently


@pytest.mark.parametrize(
    "grads_finite, loss_finite, scale, good, want",
    [
        # overflow: halve, reset the count, report it
        (False, True, 1024.0, 7, (512.0, 0, True)),
        # finite: count it; the interval (4 here) reached: double and reset
        (True, True, 1024.0, 2, (1024.0, 3, False)),
        (True, True, 1024.0, 3, (2048.0, 0, False)),
        # a non-finite loss is not the scale's doing: nothing changes
        (False, False, 1024.0, 3, (1024.0, 3, False)),
        # at the minimum the scale cannot help: left to the guard
        (False, True, 1.0, 3, (1.0, 3, False)),
    ],
)
def test_next_scale_by_hand(grads_finite, loss_finite, scale, good, want):
    got = next_scale(
        tf.constant(scale), tf.constant(good, tf.int64), tf.constant(grads_finite),
        tf.constant(loss_finite), growth_interval=4, minimum=1.0,
    )
    assert (float(got[0]), int(got[1]), bool(got[2])) == want


def test_mixed_cpu_and_gpu_towers_are_refused():
    towers = (Tower(0, "/gpu:0", 2), Tower(1, "/cpu:0", 2))
    with pytest.raises(ValueError) as err:
        precision.mixed_dtype(Placement(towers, "/cpu:0"))
    assert flag_message(err.value) == (
        "--mixed-precision --devices /gpu:0,/cpu:0: CPU towers compute in bfloat16 and "
        "GPU towers in float16, but every tower runs the same model; use only GPU or "
        "only CPU towers, name --mixed-precision bfloat16, or drop --mixed-precision"
    )
    assert precision.mixed_dtype(Placement((Tower(0, "/gpu:0", 1),), "/cpu:0")) == "float16"
    assert precision.mixed_dtype(Placement((Tower(0, "/cpu:1", 1),), "/cpu:0")) == "bfloat16"
    # Named, bfloat16 suits both kinds; float16 only GPUs.
    assert precision.mixed_dtype(Placement(towers, "/cpu:0"), "bfloat16") == "bfloat16"
    with pytest.raises(ValueError) as err:
        precision.mixed_dtype(Placement(towers, "/cpu:0"), "float16")
    assert flag_message(err.value) == (
        "--mixed-precision float16 --devices /gpu:0,/cpu:0: CPU towers have no fast "
        "float16 arithmetic; use --mixed-precision bfloat16"
    )


@pytest.mark.slow
def test_mixed_precision_run_through_the_cli(mnist_dir, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = run_cli(
        "tower-train", "--devices", "cpu:2", "--data", mnist_dir, "--epochs", "2",
        "--steps-per-epoch", "30", "--eval-steps", "10", "--mixed-precision",
        "--metrics", str(metrics),
    )
    assert result.returncode == 0, result.stderr
    assert (
        "  compute  mixed bfloat16 (variables and loss in float32), no loss scaling"
        in result.stdout
    )
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["steps"] for r in records] == [30, 30]
    assert records[1]["loss"] < records[0]["loss"] < 1.5
    assert records[1]["eval_accuracy"] >= 0.85
    assert "loss_scale" not in records[1]  # bfloat16 needs none
