"""Compression around a reducer that owns its transport.

The built-in hop algorithms (central, ring, tree, hierarchical) compress per
transfer through their Link and add in full precision. Reducers whose
transfers TensorFlow or the user makes (collective, nccl, a user function)
are wrapped instead: gradients are cast down on each tower's device, reduced
in the narrow dtype, and cast back on each destination.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from engine.reducers.base import COMPRESSION, Reducer
from engine.reducers.stateful import ReducerContext, build_state


@dataclasses.dataclass(frozen=True)
class Cast:
    inner: Reducer
    compress: str

    def build(self, context: ReducerContext) -> None:
        """Builds the inner reducer for the narrow gradients it will be given."""
        narrow = COMPRESSION[self.compress]
        build_state(self.inner, context.replace(
            dtypes=tuple(narrow if d.is_floating else d for d in context.dtypes)))

    def __call__(self, tower_grads, devices, destinations):
        narrow = COMPRESSION[self.compress]
        wide = [g.dtype for g in tower_grads[0]]
        cast_down = []
        for grads, device in zip(tower_grads, devices):
            with tf.device(device):
                cast_down.append([tf.cast(g, narrow) if g.dtype.is_floating else g for g in grads])
        reduced = self.inner(cast_down, devices, destinations)
        out = []
        for grads, destination in zip(reduced, destinations):
            with tf.device(destination):
                out.append([tf.cast(g, dtype) for g, dtype in zip(grads, wide)])
        return out
