"""Reduction that overlaps the backward pass: buckets last layer first, each
device's bucket launches chained in one order, and the profiled step shows the
first bucket reduced while the first layer's backward still runs."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import LOGICAL_CPUS

from engine import reducers
from engine.core.step import TowerStep
from engine.core.variables import ReduceDeviceVariables
from engine.placement import log as placement_log
from engine.placement import overlap, report
from engine.reducers import ReducerOptions
from engine.reducers.packing import AFTER_PREVIOUS, bucket_scope
from engine.topology.devices import DeviceRequest, canonical, resolve

DEVICES = [f"/cpu:{k}" for k in range(LOGICAL_CPUS)]


def placement_of(num_towers):
    return resolve(DeviceRequest(tuple(DEVICES[:num_towers]), reduce_device="/cpu:0"), DEVICES)


def bucket_of(name: str) -> int | None:
    for part in name.split("/"):
        if part.startswith("bucket_") and part[7:].isdigit():
            return int(part[7:])
    return None


@pytest.mark.parametrize("name", ["ring", "collective"])
def test_each_device_launches_bucket_reductions_in_one_order(name):
    p = placement_of(3)
    reducer = reducers.build(ReducerOptions(name=name, pack_bytes=1), p)  # one bucket each
    shapes = [[5, 3], [3], [3, 2], [2]]
    values = [[tf.constant(np.full(s, k + 1.0, np.float32)) for s in shapes] for k in range(3)]
    grads = []
    for device, tower in zip(p.devices, values):
        with tf.device(device):
            grads.append([tf.identity(v) for v in tower])
    function = tf.function(lambda: reducer(grads, list(p.devices), list(p.devices)))
    graph = function.get_concrete_function().graph
    launched: dict[tuple[int, str], set[str]] = {}
    for op in graph.get_operations():
        k = bucket_of(op.name)
        if k is not None and op.device:
            launched.setdefault((k, canonical(op.device)), set()).add(op.name)
    assert {k for k, _ in launched} == {0, 1, 2, 3}
    gates = [op for op in graph.get_operations()
             if op.name.rsplit("/", 1)[-1].startswith(AFTER_PREVIOUS)]
    assert len(gates) == 3 * 3  # buckets 1..3 on each of the 3 devices
    for gate in gates:
        k, device = bucket_of(gate.name), canonical(gate.device)
        waits_for = {op.name for op in gate.control_inputs}
        # Every op bucket k-1 placed on this device, and nothing else.
        assert waits_for == launched[(k - 1, device)] - {g.name for g in gates}
        assert all(bucket_of(n) == k - 1 for n in waits_for)
    # And the mean is still the mean.
    for result in function():
        for got, shape in zip(result, shapes):
            np.testing.assert_allclose(got.numpy(), np.full(shape, 2.0))


def test_bucket_scope_names_the_reduction_phase():
    from engine import scopes

    assert scopes.phase(f"reduce/{bucket_scope(2)}/reduce/AddN") == scopes.REDUCE


def test_first_bucket_is_reduced_while_the_first_layer_is_still_backward():
    """Four dense layers, a bucket each (eight), on two towers: the profiled
    step's first bucket (the last layer's bias) starts its reduction before
    the first layer's backward ops end, and part of the reduction is hidden."""
    p = placement_of(2)
    keras.utils.set_random_seed(1)

    def model():
        return keras.Sequential([
            keras.Input((28, 28, 1)), keras.layers.Flatten(),
            keras.layers.Dense(1024, activation="relu", name="first"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])

    variables = ReduceDeviceVariables(model, lambda: keras.optimizers.SGD(0.01), p)
    reducer = reducers.build(ReducerOptions(name="central", pack_bytes=1), p)
    iterators = []
    for tower in p.towers:
        with tf.device(tower.device):
            batch = (tf.random.uniform([256, 28, 28, 1], seed=tower.index),
                     tf.zeros([256, 1], tf.int32))
            iterators.append(iter(tf.data.Dataset.from_tensors(batch).repeat()))
    info = placement_log.RunInfo(towers=tuple(p.devices), reduce_device="/cpu:0",
                                 parameters=0, parameter_bytes=0, batch_size=256, model="dense")
    # Overlap needs a free thread while backward runs; on a loaded two-core
    # host one profiled step may run serially (or the profiler may record
    # nothing), so the claim must hold in one of three profiled steps, each
    # named in the failure message.
    seen = []
    for _ in range(3):
        # A new step each time: placement is reported on a function's first call.
        step = TowerStep(variables=variables, placement=p, reducer=reducer)
        log = placement_log.PlacementLog(None, info)
        with tf.device("/cpu:0"):
            for _ in range(2):  # captured, then profiled
                log.call("train", step.train, iterators)
        slices = report.slices(log.entries, "train")
        first_layer = [s for s in slices  # Keras may name it first_1
                       if s["phase"] == "backward" and re.search(r"/first(_\d+)?/", s["name"])]
        bucket_0 = [s for s in slices if bucket_of(s["name"]) == 0 and s["phase"] == "reduce"]
        if not (first_layer and bucket_0):
            seen.append(f"{len(slices)} slices, {len(first_layer)} of the first layer's "
                        f"backward, {len(bucket_0)} of bucket 0's reduction; notes {log.notes}")
            continue
        first_layer_end = max(s["start_us"] + s["dur_us"] for s in first_layer)
        bucket_0_start = min(s["start_us"] for s in bucket_0)
        measured = overlap.overlap(slices)
        seen.append(f"bucket 0 from {bucket_0_start:.0f} us, first layer's backward until "
                    f"{first_layer_end:.0f} us, {measured}")
        if (bucket_0_start < first_layer_end
                and measured.first_reduce_us < measured.backward_end_us
                and 0.0 < measured.hidden_fraction <= 1.0):
            return
    pytest.fail("no profiled step overlapped reduction and backward: " + "; ".join(seen))


def test_overlap_of_hand_made_slices():
    def s(phase, start, dur):
        return {"name": "x", "phase": phase, "start_us": start, "dur_us": dur}

    measured = overlap.overlap([s("backward", 0, 10), s("backward", 5, 10), s("reduce", 12, 6),
                                s("reduce", 14, 2), s("update", 0, 100), s("forward", 20, 5)])
    assert (measured.reduce_us, measured.hidden_us) == (6.0, 3.0)
    assert (measured.first_reduce_us, measured.backward_end_us) == (12.0, 15.0)
    assert measured.hidden_fraction == 0.5
