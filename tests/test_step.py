"""The towers' step: the mean gradient, where it is computed, and the update."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from engine.core import loop
from engine.core.step import TowerStep
from engine.core.tower import tower_gradients
from engine.core.variables import ReduceDeviceVariables
from engine.placement import log as placement
from engine.reducers.central import Central
from engine.topology.devices import DeviceRequest, resolve
from towers import models

BATCH = 16
VISIBLE = [f"/cpu:{k}" for k in range(4)]


def make_step(num_towers, optimizer=None, reduce_device="/cpu:0"):
    towers = tuple(VISIBLE[:num_towers])
    placement = resolve(DeviceRequest(towers, reduce_device=reduce_device), VISIBLE)
    keras.utils.set_random_seed(1)
    variables = ReduceDeviceVariables(
        lambda: models.mlp((28, 28, 1), 10, dropout=0.0),  # deterministic
        lambda: optimizer or keras.optimizers.SGD(0.1),
        placement,
    )
    return TowerStep(
        variables=variables, placement=placement, reducer=Central(placement.reduce_device)
    )


def tower_batches(digits, step):
    """Real digits, BATCH per tower, each batch placed on its tower's device."""
    n = len(step.placement.towers)
    images = digits.train_images[: n * BATCH, :, :, None].astype(np.float32) / 255.0
    labels = digits.train_labels[: n * BATCH, None].astype(np.int32)
    batches = []
    for k, tower in enumerate(step.placement.towers):
        with tf.device(tower.device):
            part = slice(k * BATCH, (k + 1) * BATCH)
            batches.append((tf.identity(images[part]), tf.identity(labels[part])))
    return images, labels, batches


@pytest.mark.parametrize("num_towers", [1, 2, 4])
def test_mean_of_towers_equals_one_device_on_the_whole_batch(digits, num_towers):
    step = make_step(num_towers)
    images, labels, batches = tower_batches(digits, step)

    reduced = tf.function(step.gradients)(batches)
    (towers_grads,), loss = reduced.grads, reduced.loss
    assert reduced.finite.numpy().tolist() == [True] * num_towers
    with tf.device("/cpu:0"):
        whole = tf.function(lambda x, y: tower_gradients(step.model, x, y))(images, labels)

    assert len(towers_grads) == len(whole.grads) == 4
    for got, want in zip(towers_grads, whole.grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(loss.numpy(), whole.loss.numpy(), rtol=1e-5)


def test_update_applies_the_mean_not_the_sum(digits):
    step = make_step(2, keras.optimizers.SGD(0.5))
    images, labels, batches = tower_batches(digits, step)
    before = [v.numpy() for v in step.model.trainable_variables]
    with tf.device("/cpu:0"):
        whole = tower_gradients(step.model, images, labels)

    step.train([iter([b]) for b in batches])  # plain iterators, one batch each

    for old, new, grad in zip(before, step.model.trainable_variables, whole.grads):
        np.testing.assert_allclose(new.numpy(), old - 0.5 * grad.numpy(), atol=2e-6)
    metrics = step.sums.averages()
    assert metrics["steps"] == 1
    np.testing.assert_allclose(metrics["loss"], whole.loss.numpy(), rtol=1e-5)


def assigned_devices(function, *args):
    """{op name: assigned device} from the runtime placement of one call."""
    _, metadata = placement.collect(function, *args)
    return {
        r["name"]: r["assigned"]
        for r in placement.records(metadata, "train", [])
        if r["kind"] == "op"
    }


def test_each_tower_runs_its_backward_pass_on_its_own_device(digits):
    step = make_step(4, reduce_device="/cpu:3")
    _, _, batches = tower_batches(digits, step)
    devices = assigned_devices(tf.function(step.gradients), batches)

    for k in range(4):
        backward = {
            d for name, d in devices.items() if name.startswith(f"gradient_tape/tower_{k}/")
        }
        forward = {
            d for name, d in devices.items()
            # Reading a variable runs where the variable lives, on the reduce device.
            if name.startswith(f"tower_{k}/") and not name.endswith("ReadVariableOp")
        }
        assert backward == {f"/cpu:{k}"}
        assert forward == {f"/cpu:{k}"}
    mean_ops = {d for name, d in devices.items() if name.startswith("reduce/")}
    assert mean_ops == {"/cpu:3"}



def test_a_loop_of_steps_equals_the_steps_one_by_one(digits):
    """--steps-per-loop runs the same steps in one call: bit for bit."""
    from conftest import digit_iterators

    one_by_one, looped = make_step(2), make_step(2)
    iterators = digit_iterators(digits, one_by_one.placement, 6, BATCH)
    losses = [float(one_by_one.train(iterators).loss) for _ in range(6)]
    outputs = looped.train_loop(digit_iterators(digits, looped.placement, 6, BATCH),
                                tf.constant(6))
    # Every step's own loss comes back, not only the last one's.
    assert outputs.loss.numpy().tolist() == losses
    assert int(looped.global_step.numpy()) == int(one_by_one.global_step.numpy()) == 6
    for a, b in zip(one_by_one.model.trainable_variables, looped.model.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert looped.sums.averages() == one_by_one.sums.averages()


def test_a_loop_ends_at_its_first_non_finite_step():
    """The loop hands back the step whose tower 1 went non-finite (step 6),
    so the non-finite guard names it as it would with one step per call."""
    from tests.user_models import nan_on_tower_1_at_step_6

    placement_ = resolve(DeviceRequest(("/cpu:0", "/cpu:1")), VISIBLE)
    variables = ReduceDeviceVariables(lambda: nan_on_tower_1_at_step_6((4,), 3),
                                      lambda: keras.optimizers.SGD(0.1), placement_)
    step = TowerStep(variables=variables, placement=placement_, reducer=Central("/cpu:0"))
    iterators = []
    for tower in placement_.towers:
        with tf.device(tower.device):
            batch = (tf.ones([8, 4]), tf.zeros([8, 1], tf.int32))
            iterators.append(iter(tf.data.Dataset.from_tensors(batch).repeat()))
    outputs = step.train_loop(iterators, tf.constant(10))
    # The loop runs its ten steps (its condition never waits on the device),
    # but after step 6 none of them leaves a trace: the state is step 6's.
    assert outputs.finite.numpy()[:, 1].tolist() == [True] * 5 + [False] * 5
    assert (int(step.global_step.numpy()), int(step.skipped.numpy())) == (6, 1)
    assert step.sums.averages()["steps"] == 5  # the sixth update was not applied
    steps = loop.per_step(outputs)
    assert len(steps) == 6 and steps[-1]["block_end"]
    assert steps[-1]["finite"].tolist() == [True, False]
    # Without halting (skip_nonfinite) every step counts, and tower 1 stays
    # poisoned: ten more steps, all skipped.
    step.train_loop(iterators, tf.constant(10), False)
    assert (int(step.global_step.numpy()), int(step.skipped.numpy())) == (16, 11)
    assert step.sums.averages()["steps"] == 5
