"""Measuring a reducer alone: the bytes it moves, and a function to time it.

Used by tower-reduce-bench and by the tests that pin each algorithm's traffic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from engine.placement import log as placement


def reduction_transfers(
    reducer, devices: Sequence[str], destinations: Sequence[str],
    sizes: Sequence[int | Sequence[int]], dtype=tf.float32,
) -> list[dict]:
    """Transfers of one call of `reducer` on tensors of `sizes` per device
    (element counts, or shapes).

    The inputs are variables read on their devices, and each destination
    stores a sum of its result in a variable of its own (a side effect keeps
    the reduction alive without returning tensors to the caller's device), so
    nothing but the reduction crosses devices. Returns (function, transfer
    records of its first call); call `function()` again to time it.
    """
    inputs, sinks = [], []
    for k, device in enumerate(devices):
        with tf.device(device):
            inputs.append(
                [tf.Variable(np.full([n] if isinstance(n, int) else list(n), k + 1.0),
                             dtype=dtype, trainable=False) for n in sizes]
            )
    for destination in destinations:
        with tf.device(destination):
            sinks.append(tf.Variable(tf.zeros([], dtype), trainable=False))

    @tf.function
    def reduce_once():
        grads = []
        for device, tower in zip(devices, inputs):
            with tf.device(device):
                grads.append([v.read_value() for v in tower])
        reduced = reducer(grads, devices, destinations)
        for destination, sink, result in zip(destinations, sinks, reduced):
            with tf.device(destination):
                sink.assign(tf.add_n([tf.reduce_sum(g) for g in result]))

    _, metadata = placement.collect(reduce_once)
    graph = reduce_once.get_concrete_function().graph
    sent = [
        t for t in placement.records(metadata, "train", devices, graph)
        if t["kind"] == "transfer" and not t["control"]
    ]
    return reduce_once, sent
