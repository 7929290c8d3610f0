"""Packing: fuse gradients into buffers of about `pack_bytes` before reducing.

Many small tensors cost a transfer each; a few large buffers move the same
bytes in fewer messages (the idea behind Horovod's tensor fusion and
tf_cnn_benchmarks' gradient repacking). Consecutive gradients of one dtype are
flattened and concatenated on each tower's device, the buffers are reduced by
the wrapped reducer, and each destination splits them back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

from engine.reducers.base import Reducer, check_towers
from engine.reducers.stateful import ReducerContext, build_state


def plan(grads: Sequence[tf.Tensor], pack_bytes: int) -> list[list[int]]:
    """Indices of `grads` in buckets: consecutive, one dtype, about `pack_bytes`.

    A bucket closes once it reaches `pack_bytes`, so a tensor larger than
    `pack_bytes` travels alone.
    """
    buckets: list[list[int]] = []
    size = 0
    for i, grad in enumerate(grads):
        same_dtype = buckets and grads[buckets[-1][0]].dtype == grad.dtype
        if not buckets or size >= pack_bytes or not same_dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += grad.shape.num_elements() * grad.dtype.size
    return buckets


@dataclasses.dataclass(frozen=True)
class Packed:
    inner: Reducer
    pack_bytes: int

    def build(self, context: ReducerContext) -> None:
        """Builds the inner reducer for the buffers it will be given."""
        specs = [tf.TensorSpec(s, d) for s, d in zip(context.shapes, context.dtypes)]
        buckets = plan(specs, self.pack_bytes)
        build_state(self.inner, context.replace(
            shapes=tuple(tf.TensorShape([sum(specs[i].shape.num_elements() for i in b)])
                         for b in buckets),
            dtypes=tuple(specs[b[0]].dtype for b in buckets),
        ))

    def __call__(self, tower_grads, devices, destinations):
        check_towers(tower_grads, devices)
        first = tower_grads[0]
        buckets = plan(first, self.pack_bytes)
        packed = []
        for grads, device in zip(tower_grads, devices):
            with tf.device(device), tf.name_scope("pack"):
                packed.append(
                    [tf.concat([tf.reshape(grads[i], [-1]) for i in b], 0) for b in buckets]
                )
        reduced = self.inner(packed, devices, destinations)
        out = []
        for buffers, destination in zip(reduced, destinations):
            grads = [None] * len(first)
            with tf.device(destination), tf.name_scope("unpack"):
                for bucket, buffer in zip(buckets, buffers):
                    sizes = [first[i].shape.num_elements() for i in bucket]
                    for i, part in zip(bucket, tf.split(buffer, sizes)):
                        grads[i] = tf.reshape(part, first[i].shape)
            out.append(grads)
        return out
