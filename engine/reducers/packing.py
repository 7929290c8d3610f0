"""Packing: fuse gradients into buffers of about `pack_bytes` before reducing.

Many small tensors cost a transfer each; a few large buffers move the same
bytes in fewer messages (the idea behind Horovod's tensor fusion and
tf_cnn_benchmarks' gradient repacking). Gradients of one dtype are flattened
and concatenated on each tower's device, the buffers are reduced by the
wrapped reducer, and each destination splits them back.

Buckets overlap the backward pass, as PyTorch DDP's do:

* they are formed in the order backward produces the gradients, the last
  layer's first, so the first bucket is complete while the first layers'
  gradients are still being computed, and its reduction can run then;
* each bucket's reduction reads only its own gradients;
* buckets are launched in one fixed order on every device (for a wrapped
  reducer without state; one with state, kept per buffer, gets every buffer
  in one call): on each device,
  bucket k+1's buffer waits (a control dependency, `reduce/bucket_K/after_previous`)
  for every op bucket k's reduction placed on that device. Collective
  launches (NCCL, CollectiveReduce) then cannot interleave differently on
  different devices, which deadlocks them (HugeCTR#269, tensorflow#42111).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

from engine import scopes
from engine.reducers.base import Reducer
from engine.reducers.stateful import ReducerContext, build_state, stateful_part
from engine.topology.devices import canonical

__all__ = ["AFTER_PREVIOUS", "Packed", "bucket_scope", "plan"]

AFTER_PREVIOUS = "after_previous"


def plan(grads: Sequence[tf.Tensor], pack_bytes: int) -> list[list[int]]:
    """Indices of `grads` in buckets, in backward order (the last gradient
    first): consecutive, one dtype, about `pack_bytes` each.

    A bucket closes once it reaches `pack_bytes`, so a tensor larger than
    `pack_bytes` travels alone.
    """
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(grads))):
        grad = grads[i]
        same_dtype = buckets and grads[buckets[-1][0]].dtype == grad.dtype
        if not buckets or size >= pack_bytes or not same_dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += grad.shape.num_elements() * grad.dtype.size
    return buckets


def bucket_scope(index: int) -> str:
    """The name scope of bucket `index`'s reduction."""
    return f"bucket_{index}"


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
        first = tower_grads[0]
        buckets = plan(first, self.pack_bytes)
        packed = []
        for grads, device in zip(tower_grads, devices):
            with tf.device(device), tf.name_scope("pack"):
                packed.append(
                    [tf.concat([tf.reshape(grads[i], [-1]) for i in b], 0) for b in buckets]
                )
        if stateful_part(self.inner) is None:
            reduced = self._chained(packed, devices, destinations)
        else:  # its state is per buffer position: one call with every buffer
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

    def _chained(self, packed, devices, destinations):
        """The buffers reduced one bucket at a time, each device's launches
        chained in bucket order."""
        reduced = [[] for _ in destinations]
        previous: dict[str, list[tf.Operation]] = {}
        with tf.name_scope(scopes.REDUCE):
            for k in range(len(packed[0])):
                with tf.name_scope(bucket_scope(k)):
                    inputs = [[_after(buffers[k], device, previous.get(canonical(device)))]
                              for buffers, device in zip(packed, devices)]
                    before = len(_graph_ops())
                    results = self.inner(inputs, devices, destinations)
                    previous = _by_device(_graph_ops()[before:])
                for out, (buffer,) in zip(reduced, results):
                    out.append(buffer)
        return reduced


def _graph_ops() -> list[tf.Operation]:
    """The ops of the graph being built; none when executing eagerly, where
    ops run in the order they are called anyway."""
    if tf.executing_eagerly():
        return []
    return tf.compat.v1.get_default_graph().get_operations()


def _by_device(ops: Sequence[tf.Operation]) -> dict[str, list[tf.Operation]]:
    """`ops` grouped by the canonical name of the device each asks for."""
    grouped: dict[str, list[tf.Operation]] = {}
    for op in ops:
        device = canonical(op.device) if op.device else None
        if device is not None:
            grouped.setdefault(device, []).append(op)
    return grouped


def _after(buffer: tf.Tensor, device: str, ops: list[tf.Operation] | None) -> tf.Tensor:
    """`buffer`, available on `device` only once `ops` have run."""
    if not ops:
        return buffer
    with tf.device(device), tf.control_dependencies(ops):
        return tf.identity(buffer, name=AFTER_PREVIOUS)
