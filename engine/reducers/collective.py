"""collective: TensorFlow's own collective all-reduce (CollectiveReduceV2).

One CollectiveReduceV2 per device and gradient, all with the same group key
and an instance key per gradient, `merge_op="Add"` and `final_op="Div"` so
the result is the mean. TensorFlow picks the transport (ring on CPUs, NCCL on
GPUs when `communication_hint="nccl"` is honoured). Each device gets an
ordering token so its collectives launch in program order.

In one process every participant blocks an inter-op thread while it waits for
the others; with fewer inter-op threads than participants that can deadlock,
so the reducer refuses to build when TensorFlow was configured with too few
(a run raises the count before TensorFlow starts: engine.run.session).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from engine.reducers.base import ReducerError
from engine.reducers.flat import FlatReducer

_group_keys = itertools.count(1)


_instance_keys = itertools.count(1)


class Collective:
    """All-reduce with CollectiveReduceV2 over the towers' devices."""

    def __init__(self, devices: Sequence[str], communication: str = "auto"):
        threads = tf.config.threading.get_inter_op_parallelism_threads()
        if threads and threads < len(devices):
            raise ReducerError(
                f"<reducer=collective> with {len(devices)} towers needs at least "
                f"{len(devices)} inter-op threads, TensorFlow has {threads}; "
                "raise it before TensorFlow starts or use <reducer=ring>"
            )
        self.devices = list(devices)
        self.communication = communication
        self.group_key = next(_group_keys)
        self.tokens = []
        for device in self.devices:
            with tf.device(device):
                self.tokens.append(tf.Variable(0.0, trainable=False).handle)

    def all_reduce(self, flats, devices):
        if list(devices) != self.devices:
            raise ReducerError(
                f"the collective reducer was built for {self.devices}, called on {list(devices)}"
            )
        instance = next(_instance_keys)
        out = []
        for flat, device, token in zip(flats, devices, self.tokens):
            with tf.device(device):
                out.append(
                    collective_ops.all_reduce_v2(
                        flat, len(devices), self.group_key, instance,
                        merge_op="Add", final_op="Div",
                        communication_hint=self.communication, ordering_token=token,
                    )
                )
        return out

    def __call__(self, tower_grads, devices, destinations):
        return FlatReducer(self.all_reduce)(tower_grads, devices, destinations)
