"""--xla: each tower's forward and backward compiled by XLA, on its own device."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import digit_iterators, run_cli

from engine.core import precision
from engine.core.loss_scale import DynamicLossScale
from engine.core.step import TowerStep
from engine.core.variables import ReplicatedVariables
from engine.placement import log as placement
from engine.placement import report as placement_report
from engine.reducers.central import Central
from engine.topology.devices import DeviceRequest, resolve
from towers import models

BATCH = 32
STEPS = 30
VISIBLE = [f"/cpu:{k}" for k in range(4)]


def make_step(
    *, xla, num_towers=2, optimizer=lambda: keras.optimizers.SGD(0.1),
    compute_dtype="float32", loss_scale=None, xla_update=False,
):
    """A replicated-variable step; the same seed gives every step the same weights."""
    placement = resolve(DeviceRequest(tuple(VISIBLE[:num_towers])), VISIBLE)
    keras.utils.set_random_seed(3)

    def make_model():
        with precision.policy(compute_dtype):
            return models.mlp((28, 28, 1), 10, dropout=0.0)

    variables = ReplicatedVariables(make_model, optimizer, placement, xla=xla_update)
    return TowerStep(
        variables=variables, placement=placement, reducer=Central(placement.reduce_device),
        loss_scale=loss_scale, xla=xla,
    )


def tower_iterators(digits, step, steps=STEPS):
    return digit_iterators(digits, step.placement, steps, BATCH)


def test_xla_step_gives_the_gradients_of_the_plain_step(digits):
    plain, compiled = make_step(xla=False), make_step(xla=True)
    for a, b in zip(plain.model.trainable_variables, compiled.model.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    batches = [next(it) for it in tower_iterators(digits, plain, steps=1)]

    want = tf.function(plain.gradients)(batches)
    got_function = tf.function(compiled.gradients)
    got = got_function(batches)

    for destination_got, destination_want in zip(got.grads, want.grads):
        for g, w in zip(destination_got, destination_want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.loss.numpy(), want.loss.numpy(), rtol=1e-6)
    assert got.correct.numpy() == want.correct.numpy()
    # Each tower's work really is one call XLA must compile, in the tower's scope.
    graph = got_function.get_concrete_function(batches).graph
    compiled_calls = sorted(
        op.name for op in graph.get_operations()
        if "_XlaMustCompile" in op.node_def.attr and op.get_attr("_XlaMustCompile")
    )
    assert [name.split("/")[0] for name in compiled_calls] == ["tower_0", "tower_1"]


def test_xla_training_decreases_the_loss_like_the_plain_step(digits):
    losses = {}
    for xla in (False, True):
        step = make_step(xla=xla, optimizer=lambda: keras.optimizers.Adam(2e-3))
        iterators = tower_iterators(digits, step)
        losses[xla] = [float(step.train(iterators).loss) for _ in range(STEPS)]
    first, last = np.mean(losses[True][:5]), np.mean(losses[True][-5:])
    assert last < 0.5 * first, losses[True]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-3)


@pytest.mark.slow
def test_an_xla_compiled_update_trains_like_the_plain_one(digits):
    """--xla compiles each replica's Adam update too: the same weights, to float
    rounding, with every replica still identical."""
    adam = lambda: keras.optimizers.Adam(2e-3)  # noqa: E731
    plain, compiled = make_step(xla=True, optimizer=adam), make_step(
        xla=True, optimizer=adam, xla_update=True)
    steps = 10
    for step in (plain, compiled):
        iterators = tower_iterators(digits, step, steps)
        for _ in range(steps):
            step.train(iterators)
    for a, b in zip(plain.model.trainable_variables, compiled.model.trainable_variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-6)
    assert int(compiled.variables.optimizers[1].iterations.numpy()) == steps
    assert compiled.variables.check(0.0, steps) == 0.0
    # Adam's square roots run as ops of their own only in the plain update;
    # compiled, they are inside one call per replica. (A step's graphs are in
    # the run metadata of its first call only: fresh steps.)
    for xla_update, sqrt in ((False, True), (True, False)):
        step = make_step(xla=True, optimizer=adam, xla_update=xla_update)
        iterators = tower_iterators(digits, step, steps=1)
        _, metadata = placement.collect(step.train, iterators)
        ops = placement.records(metadata, "train", step.placement.devices)
        update = [e for e in ops if e["kind"] == "op" and "/update/" in e["name"]]
        assert any(e["op"] == "Sqrt" for e in update) == sqrt


def test_xla_towers_take_the_loss_scale_from_the_reduce_device(digits):
    """The scale lives on /cpu:0; each compiled tower gets its value, so a
    float16 overflow is seen, skipped and halved as without XLA."""
    step = make_step(
        xla=True, compute_dtype="float16",
        loss_scale=DynamicLossScale("/cpu:0", initial=2.0**30),
    )
    iterators = tower_iterators(digits, step, steps=20)
    overflows = [bool(step.train(iterators).overflow) for _ in range(20)]
    k = overflows.index(False)
    assert overflows[:k] == [True] * k and k >= 5
    assert float(step.loss_scale.scale.numpy()) <= 2.0**30 / 2**k
    assert int(step.sums.steps.numpy()) == 20 - sum(overflows) > 0


@pytest.mark.slow
def test_xla_run_keeps_each_tower_on_its_device(mnist_dir, tmp_path):
    """Through the CLI, with the placement log and --strict-placement on."""
    log = tmp_path / "xla.jsonl"
    result = run_cli(
        "tower-train", "--devices", "cpu:2", "--data", mnist_dir, "--epochs", "1",
        "--steps-per-epoch", "3", "--eval-steps", "2", "--xla", "--variables", "replicated",
        "--placement-log", str(log), "--strict-placement",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "  compute  float32, XLA: each tower's forward and backward, and each replica's update, "
            "compiled on its device"
        in result.stdout
    )
    assert "3/3 ━" in result.stdout
    entries = placement_report.load(str(log))
    assert placement_report.strays(entries) == []
    train_ops = placement_report.ops(entries, "train")
    for k in range(2):
        # XLA leaves one op per tower in the runtime graph: the compiled call.
        tower_ops = [o for o in train_ops if o["tower"] == k]
        assert {(o["op"], o["assigned"]) for o in tower_ops} == {
            ("StatefulPartitionedCall", f"/cpu:{k}")
        }
    assert {o["assigned"] for o in train_ops if o["tower"] == "reduce"} == {"/cpu:0", "/cpu:1"}


def one_tower_step(*, xla, compute_dtype="float32", loss_scale=None):
    """One tower on /cpu:0 with its variables there too: the whole step compiles."""
    from engine.core.variables import ReduceDeviceVariables

    placement = resolve(DeviceRequest(("/cpu:0",)), VISIBLE)
    keras.utils.set_random_seed(3)

    def make_model():
        with precision.policy(compute_dtype):
            return models.mlp((28, 28, 1), 10, dropout=0.0)

    variables = ReduceDeviceVariables(make_model, lambda: keras.optimizers.Adam(2e-3),
                                      placement, xla=xla)
    return TowerStep(variables=variables, placement=placement,
                     reducer=Central(placement.reduce_device), loss_scale=loss_scale, xla=xla)


def test_a_tower_on_its_variables_device_is_compiled_whole_and_trains_like_the_plain_step(
        digits):
    """Forward, backward, reduction, the non-finite skip, the update and the
    metric sums as one XLA program: the same losses and weights as the plain
    step to float rounding, and one compiled call in the runtime graph after
    the input."""
    steps, losses, models_ = 10, {}, {}
    for xla in (False, True):
        step = one_tower_step(xla=xla)
        assert step.whole_step == xla
        iterators = tower_iterators(digits, step, steps)
        losses[xla] = [float(step.train(iterators).loss) for _ in range(steps)]
        models_[xla] = step
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4)
    for a, b in zip(models_[False].model.trainable_variables,
                    models_[True].model.trainable_variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-6)
    assert models_[True].sums.averages()["steps"] == steps
    assert int(models_[True].global_step.numpy()) == steps

    step = one_tower_step(xla=True)
    iterators = tower_iterators(digits, step, steps=1)
    _, metadata = placement.collect(step.train, iterators)
    ops = [e for e in placement.records(metadata, "train", step.placement.devices)
           if e["kind"] == "op"]
    # No update op, no tf.cond, no metric sum runs outside the compiled program.
    assert not [e for e in ops if "/update/" in e["name"] or e["op"] in ("Switch", "Merge")]
    assert [e["op"] for e in ops if e["op"] == "StatefulPartitionedCall"] == [
        "StatefulPartitionedCall"]


def test_the_whole_step_program_skips_and_halves_on_a_loss_scale_overflow(digits):
    """The dynamic loss scale inside the compiled step: overflowing steps are
    skipped and halve the scale, as in the plain step."""
    step = one_tower_step(xla=True, compute_dtype="float16",
                          loss_scale=DynamicLossScale("/cpu:0", initial=2.0**30))
    iterators = tower_iterators(digits, step, steps=20)
    overflows = [bool(step.train(iterators).overflow) for _ in range(20)]
    k = overflows.index(False)
    assert overflows[:k] == [True] * k and k >= 5
    assert float(step.loss_scale.scale.numpy()) <= 2.0**30 / 2**k
    assert int(step.sums.steps.numpy()) == 20 - sum(overflows) > 0


def test_the_whole_step_program_has_no_branch_and_a_bad_step_leaves_no_trace(digits):
    """An XLA conditional or loop is decided on the host: a GPU copies its
    predicate there and waits for everything queued before it. The compiled
    step (loss scale, skip, update, sums) has neither; its skip is a select,
    and a skipped or disallowed step still leaves every variable as it was."""
    step = one_tower_step(xla=True, compute_dtype="float16",
                          loss_scale=DynamicLossScale("/cpu:0"))
    batches = step._next_batches(tower_iterators(digits, step, steps=1))
    hlo = step._update_on.experimental_get_compiler_ir(batches, tf.constant(True))(stage="hlo")
    assert " conditional(" not in hlo and " while(" not in hlo
    assert hlo.count(" dot(") >= 3 and " select(" in hlo  # the real step, skip by select

    step._update_on(batches, tf.constant(True))  # one good step: Adam's slots are not zero
    written = step.variables.updated_variables()
    state = lambda: [np.array(v.numpy()) for v in [*written, step.loss_scale.scale,  # noqa: E731
                                                   step.loss_scale.good_steps, step.sums.steps]]
    before = state()
    images, labels = batches[0]
    poisoned = [(images * float("nan"), labels)]
    outputs = step._update_on(poisoned, tf.constant(True))
    assert not outputs.finite.numpy().any() and not bool(outputs.overflow)
    after_nan = state()
    outputs = step._update_on(batches, tf.constant(False))  # finite, but not allowed
    for want, *got in zip(before, after_nan, state()):
        for value in got:
            np.testing.assert_array_equal(value, want)
    assert (int(step.global_step.numpy()), int(step.skipped.numpy())) == (2, 1)
