"""Every reducer returns the mean, where it is needed, moving the bytes it promises."""

import json

import hypothesis.strategies as st
import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import LOGICAL_CPUS, run_cli
from hypothesis import given, settings

from engine import reducers
from engine.core import loop
from engine.core.step import TowerStep
from engine.core.variables import (
    ReduceDeviceVariables,
    ReplicaDriftError,
    ReplicatedVariables,
)
from engine.reducers import ReducerError, ReducerOptions, measure
from engine.reducers.hierarchical import groups_of
from engine.reducers.packing import plan
from engine.topology.devices import DeviceRequest, canonical, resolve
from towers import models

DEVICES = [f"/cpu:{k}" for k in range(LOGICAL_CPUS)]
TOLERANCE = {tf.float64: 1e-12, tf.float32: 1e-5, tf.float16: 2e-2, tf.bfloat16: 5e-2}
ALL = ["central", "ring", "tree", "hierarchical", "collective"]


def placement_of(num_towers, reduce_device="/cpu:0", first=0):
    towers = tuple(DEVICES[first:first + num_towers])
    return resolve(DeviceRequest(towers, reduce_device=reduce_device), DEVICES)


def run_reducer(reducer, arrays, devices, destinations, dtype):
    """Places arrays[k][v] on devices[k] and reduces them in one tf.function."""
    inputs = []
    for tower, device in zip(arrays, devices):
        with tf.device(device):
            inputs.append([tf.constant(a, dtype=dtype) for a in tower])
    function = tf.function(lambda grads: reducer(grads, devices, destinations))
    result = function(inputs)
    # Where each result was asked to be: the device of the op that made it in
    # the traced graph (tf.function wraps outputs in an unplaced Identity, and
    # its eager outputs all come back to one device).
    symbolic = function.get_concrete_function(inputs).structured_outputs
    for per_destination, destination in zip(symbolic, destinations):
        for tensor in per_destination:
            made_by = tensor.op.inputs[0]
            assert canonical(made_by.device) == destination, (made_by.name, made_by.device)
    return result


def check_means(result, arrays, destinations, dtype):
    expected = [np.mean([tower[v] for tower in arrays], axis=0) for v in range(len(arrays[0]))]
    assert len(result) == len(destinations)
    for per_destination in result:
        assert len(per_destination) == len(expected)
        for got, want in zip(per_destination, expected):
            assert got.dtype == dtype and got.shape == want.shape
            tol = TOLERANCE[dtype] * max(1.0, float(np.abs(want).max(initial=0)))
            np.testing.assert_allclose(got.numpy().astype(np.float64), want, atol=tol, rtol=0)


class ReducerContract:
    """Checks every reducer must pass; subclasses say how to make theirs."""

    pack_bytes = 0

    def make(self, name, placement_):
        options = ReducerOptions(name, group_size=3, pack_bytes=self.pack_bytes)
        return reducers.build(options, placement_)

    @pytest.mark.parametrize("name", ALL)
    @pytest.mark.parametrize("num_towers", range(1, LOGICAL_CPUS + 1))
    def test_mean_on_every_tower_count(self, name, num_towers):
        p = placement_of(num_towers, reduce_device="/cpu:7")
        rng = np.random.default_rng(num_towers)
        arrays = [[rng.normal(size=(5, 3)), rng.normal(size=(7,)), rng.normal(size=())]
                  for _ in range(num_towers)]
        for destinations in (list(p.devices), ["/cpu:7"]):
            result = run_reducer(self.make(name, p), arrays, p.devices, destinations, tf.float32)
            check_means(result, arrays, destinations, tf.float32)

    @pytest.mark.parametrize("name", ALL)
    @settings(max_examples=12, deadline=None)
    @given(data=st.data())
    def test_mean_for_any_shapes_dtypes_and_towers(self, name, data):
        num_towers = data.draw(st.integers(1, LOGICAL_CPUS), label="towers")
        dtype = data.draw(st.sampled_from([tf.float32, tf.float64, tf.float16]), label="dtype")
        shapes = data.draw(st.lists(st.lists(st.integers(1, 9), max_size=3).map(tuple),
                                    min_size=1, max_size=4), label="shapes")
        replicated = data.draw(st.booleans(), label="replicated")
        reduce_device = data.draw(st.sampled_from(DEVICES), label="reduce device")
        seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
        rng = np.random.default_rng(seed)
        arrays = [[rng.uniform(-4, 4, size=s) for s in shapes] for _ in range(num_towers)]
        p = placement_of(num_towers, reduce_device)
        destinations = list(p.devices) if replicated else [reduce_device]
        result = run_reducer(self.make(name, p), arrays, p.devices, destinations, dtype)
        cast = [[np.asarray(tf.constant(a, dtype).numpy(), np.float64) for a in t] for t in arrays]
        check_means(result, cast, destinations, dtype)


class TestReducers(ReducerContract):
    pass


class TestPackedReducers(ReducerContract):
    pack_bytes = 64  # small: several buckets, some tensors alone


def test_packing_plan_groups_consecutive_same_dtype_tensors():
    grads = [tf.zeros([4]), tf.zeros([4]), tf.zeros([40]), tf.zeros([2], tf.float64), tf.zeros([3])]
    assert plan(grads, 32) == [[0, 1], [2], [3], [4]]
    assert plan(grads, 10**9) == [[0, 1, 2], [3], [4]]


def test_hierarchical_groups():
    assert groups_of(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("compress, dtype", [("fp16", tf.float16), ("bf16", tf.bfloat16)])
@pytest.mark.parametrize("name", ["central", "ring", "collective"])
def test_compression_narrows_transfers_and_keeps_the_mean(name, compress, dtype):
    p = placement_of(3, "/cpu:0", first=1)  # towers /cpu:1..3
    arrays = [[np.full((6,), k + 1.0)] for k in range(3)]
    reducer = reducers.build(ReducerOptions(name, compress=compress), p)
    destinations = list(p.devices)
    result = run_reducer(reducer, arrays, p.devices, destinations, tf.float32)
    check_means(result, arrays, destinations, tf.float32)  # exact: 1, 2, 3 fit in fp16
    sent = reduction_transfers(reducer, p.devices, destinations, 6)
    if name != "collective":  # collectives move data inside TensorFlow, not by _Send
        assert sent and {t["dtype"] for t in sent} == {dtype.name}


def reduction_transfers(reducer, devices, destinations, size):
    """The transfers of one reduction of `size` float32 per device, alone.

    Inputs are variables on the devices and each destination returns a scalar,
    so nothing but the reduction crosses devices.
    """
    return measure.reduction_transfers(reducer, devices, destinations, [size])[1]


@pytest.mark.parametrize("name", ["ring", "tree"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_and_tree_send_2_n_minus_1_over_n_per_device(name, n):
    size = 840 * n  # float32 elements, divisible into n chunks
    p = placement_of(n)
    sent = reduction_transfers(reducers.build(ReducerOptions(name), p), p.devices, list(p.devices), size)
    per_device = {d: sum(t["bytes"] for t in sent if t["src"] == d) for d in p.devices}
    ideal = 2 * (n - 1) * 4 * size // n
    assert per_device == {d: ideal for d in p.devices}


def test_central_reduce_device_receives_n_times_the_gradient():
    p = placement_of(4, "/cpu:0", first=1)  # towers /cpu:1..4, reduce /cpu:0
    size = 1000
    sent = reduction_transfers(reducers.build(ReducerOptions("central"), p), p.devices, ["/cpu:0"], size)
    received = {}
    for t in sent:
        received[t["dst"]] = received.get(t["dst"], 0) + t["bytes"]
    assert received == {"/cpu:0": 4 * 4 * size}


def test_hierarchical_only_leaders_cross_groups():
    p = placement_of(4)
    size = 1000
    sent = reduction_transfers(reducers.build(ReducerOptions("hierarchical", group_size=2), p),
                     p.devices, list(p.devices), size)
    pairs = {(t["src"], t["dst"]) for t in sent}
    # members 1 and 3 talk only to their leaders 0 and 2; the leaders talk to each other
    assert pairs == {("/cpu:1", "/cpu:0"), ("/cpu:3", "/cpu:2"), ("/cpu:0", "/cpu:2"),
                     ("/cpu:2", "/cpu:0"), ("/cpu:0", "/cpu:1"), ("/cpu:2", "/cpu:3")}
    assert sum(t["bytes"] for t in sent) == 2 * 3 * 4 * size  # 2(N-1) x gradient bytes


def test_nccl_refuses_cpu_towers_with_a_clear_error():
    with pytest.raises(ReducerError) as err:
        reducers.build(ReducerOptions("nccl"), placement_of(2))
    assert str(err.value) == (
        "--reducer nccl needs GPU towers (NCCL runs on NVIDIA GPUs); /cpu:0, /cpu:1 "
        "are not; use --reducer ring or collective"
    )


def test_nccl_refuses_towers_that_share_a_physical_gpu():
    from engine.topology.devices import logical_gpu_map, parse_request, resolve

    visible = ["/cpu:0", "/gpu:0", "/gpu:1", "/gpu:2"]
    placement_ = resolve(parse_request("gpu:3"), visible, logical_gpu_map(3, 1))
    with pytest.raises(ReducerError) as err:
        reducers.build(ReducerOptions("nccl"), placement_)
    assert str(err.value) == (
        "--reducer nccl: towers /gpu:0, /gpu:1, /gpu:2 share physical GPU 0, and NCCL "
        "needs one GPU per tower (it would wait forever); use --reducer ring, tree or "
        "collective"
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(name="butterfly"), r"^--reducer 'butterfly' is not one of central, ring, tree"),
        (dict(group_size=0), r"^--group-size \(0\) must be at least 1"),
        (dict(pack_bytes=-1), r"^--pack-bytes \(-1\) must be 0 or more"),
        (dict(compress="int8"), r"^--compress 'int8' is not one of fp16, bf16"),
    ],
)
def test_bad_reducer_options(options, message):
    with pytest.raises(ReducerError, match=message):
        ReducerOptions(**options)


# Training with each reducer: the same losses, step by step.

STEPS, BATCH = 12, 16


def train_losses(digits, reducer_name, variables_cls, num_towers=4, pack_bytes=0):
    p = placement_of(num_towers, "/cpu:0")
    keras.utils.set_random_seed(3)
    variables = variables_cls(
        lambda: models.mlp((28, 28, 1), 10, dropout=0.0),
        lambda: keras.optimizers.SGD(0.1), p)
    step = TowerStep(variables=variables, placement=p,
                     reducer=reducers.build(ReducerOptions(reducer_name, pack_bytes=pack_bytes), p))
    images = digits.train_images[..., None].astype(np.float32) / 255.0
    labels = digits.train_labels[:, None].astype(np.int32)
    iterators = []
    for k, tower in enumerate(p.towers):
        start = k * STEPS * BATCH
        part = slice(start, start + STEPS * BATCH)
        with tf.device(tower.device):
            dataset = tf.data.Dataset.from_tensor_slices((images[part], labels[part])).batch(BATCH)
            iterators.append(iter(dataset))
    return [float(step.train(iterators)["loss"]) for _ in range(STEPS)], step


@pytest.fixture(scope="module")
def central_losses(digits):
    return train_losses(digits, "central", ReduceDeviceVariables)[0]


@pytest.mark.parametrize("name", ALL + ["tests.user_reducers:gather_on_first"])
@pytest.mark.parametrize("variables_cls", [ReduceDeviceVariables, ReplicatedVariables])
def test_training_with_each_reducer_matches_central(digits, central_losses, name, variables_cls):
    losses, step = train_losses(digits, name, variables_cls, pack_bytes=4096)
    np.testing.assert_allclose(losses, central_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    if variables_cls is ReplicatedVariables:
        assert step.variables.check(1e-6, STEPS) == 0.0  # copies bit-identical


def test_check_replicas_catches_injected_drift(digits):
    _, step = train_losses(digits, "ring", ReplicatedVariables, num_towers=3)
    kernel = step.variables.models[2].trainable_variables[0]
    kernel.assign_add(tf.fill(kernel.shape, 0.01))
    with pytest.raises(ReplicaDriftError) as err:
        step.variables.check(1e-6, 12)
    name = step.variables.models[0].trainable_variables[0].path  # as tower 0 calls it
    assert str(err.value) == (
        f"--check-replicas: after step 12, tower 2's copy of {name} differs "
        "from tower 0's by 0.01 (tolerance 1e-06); the replicas no longer train the "
        "same model"
    )


def test_the_loop_checks_replicas_every_k_steps(digits):
    _, step = train_losses(digits, "central", ReplicatedVariables, num_towers=2)
    step.variables.models[1].trainable_variables[1].assign_add(tf.fill([128], 0.5))
    step.global_step.assign(0)  # a fresh run of the loop
    p = step.placement
    iterators = []
    for tower in p.towers:
        with tf.device(tower.device):
            data = tf.data.Dataset.from_tensors(
                (tf.zeros([BATCH, 28, 28, 1]), tf.zeros([BATCH, 1], tf.int32))).repeat()
            iterators.append(iter(data))
    options = loop.LoopOptions(epochs=1, steps_per_epoch=10, eval_steps=0, check_replicas=3)
    import io

    from engine.run.progress import EpochProgress
    with pytest.raises(ReplicaDriftError, match=r"^--check-replicas: after step 3, tower 1's copy"):
        loop.run(step, iterators, None, options, EpochProgress(io.StringIO()))
    assert int(step.global_step.numpy()) == 3


def test_user_reducer_trains_from_the_command_line(tmp_path):
    metrics = tmp_path / "m.jsonl"
    result = run_cli("tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
                     "--reducer", "tests.user_reducers:gather_on_first", "--epochs", "2",
                     "--steps-per-epoch", "20", "--model", "tests.user_models:tiny",
                     "--metrics", str(metrics))
    assert result.returncode == 0, result.stderr
    assert "variables, tests.user_reducers:gather_on_first mean of 2 gradients" in result.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["steps"] for r in records] == [20, 20]


def test_nccl_on_cpu_towers_exits_2_from_the_command_line():
    result = run_cli("tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
                     "--reducer", "nccl")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tower-train: error: --reducer nccl needs GPU towers (NCCL runs on NVIDIA GPUs); "
        "/cpu:0, /cpu:1 are not; use --reducer ring or collective"
    )


def test_replicated_mnist_reaches_the_default_accuracy(mnist_dir, tmp_path):
    runs = {}
    for label, extra in (("default", []),
                         ("replicated", ["--variables", "replicated", "--reducer", "ring",
                                         "--check-replicas", "50"])):
        metrics = tmp_path / f"{label}.jsonl"
        result = run_cli("tower-train", "--devices", "cpu:2", "--data", mnist_dir,
                         "--epochs", "5", "--steps-per-epoch", "100", "--metrics",
                         str(metrics), *extra)
        assert result.returncode == 0, result.stderr
        runs[label] = json.loads(metrics.read_text().splitlines()[-1])
    assert runs["replicated"]["eval_accuracy"] >= 0.94
    assert abs(runs["replicated"]["eval_accuracy"] - runs["default"]["eval_accuracy"]) < 0.01
