"""Error feedback: what a compressor left out of one step is added to the next.

Each tower keeps a residual per gradient, on its own device. A step compresses
`corrected = gradient + residual` to a payload, and keeps
`residual = corrected - sent`, where `sent` is the dense value the payload
stands for. Over K steps, per tower,

    sum of what was sent + the final residual = sum of the gradients

exactly in real arithmetic (tests/test_stateful.py checks it in float32), so
nothing a compressor drops is lost, only delayed (Seide et al., 2014; Stich
et al., 2018; Karimireddy et al., 2019). The payloads are all-gathered
(engine.reducers.primitives), since compressed data cannot be summed on the
way, and every destination rebuilds the mean from them.

With `feedback=False` nothing is held back: what a compressor drops is
lost (signSGD and top-k as the papers' ablations run them).

A subclass says how one tensor is compressed (`compress`), what a payload
costs (`payload_bytes`) and how a destination rebuilds the sum of the
towers' payloads (`decompress`).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine import scopes
from engine.reducers.primitives import all_gather
from engine.reducers.stateful import ReducerContext, StatefulReducer


class ErrorFeedback(StatefulReducer):
    """A compressor with a residual per tower and gradient; payloads all-gathered.

    Args:
      name: the tf.Module's name.
      feedback: keep each tower's residual (error feedback); False drops
        what the compressor leaves out.
    """

    lossy = True

    def __init__(self, name: str, feedback: bool = True):
        super().__init__(name=name)
        self.feedback = feedback

    def build(self, context: ReducerContext) -> None:
        self.context = context
        if self.feedback:
            self.residuals = self.per_tower("residual")

    def per_tower(self, name: str) -> list[list[tf.Variable]]:
        """[k][v]: a zero variable like gradient v on tower k's device."""
        held = []
        for device in self.context.devices:
            with tf.device(device):
                held.append([tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name)
                             for shape, dtype in zip(self.context.shapes, self.context.dtypes)])
        return held

    def encode(self, k: int, v: int, flat: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """Tower `k`'s payload of its flat gradient `v`: the gradient plus its
        residual (the gradient alone without feedback) compressed, and what
        was not sent held back as the new residual. Runs on the tower."""
        if not self.feedback:
            return self.compress(flat)[0]
        residual = self.residuals[k][v]
        corrected = flat + tf.reshape(residual, [-1])
        payload, sent = self.compress(corrected)
        left = tf.reshape(corrected - sent, residual.shape)
        # A tower whose gradient was not finite (a step the run skips) keeps
        # its residual: one NaN would poison it.
        residual.assign(tf.where(tf.reduce_all(tf.math.is_finite(left)), left, residual))
        return payload

    def compress(self, corrected: tf.Tensor) -> tuple[tuple[tf.Tensor, ...], tf.Tensor]:
        """(payload tensors, the dense value they stand for) of one tower's
        flat `corrected` gradient; runs on the tower's device."""
        raise NotImplementedError

    def decompress(self, payloads: Sequence[tuple[tf.Tensor, ...]], size: int) -> tf.Tensor:
        """The sum over towers of the dense values of `payloads`, flat, of `size`
        elements; runs on the destination."""
        raise NotImplementedError

    def payload_bytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int:
        """Bytes of one tower's payload for a gradient of `shape` and `dtype`."""
        raise NotImplementedError

    def __call__(self, tower_grads, devices, destinations):
        n = len(devices)
        out = [[] for _ in destinations]
        with tf.name_scope(scopes.REDUCE):
            for v, grads in enumerate(zip(*tower_grads)):
                size = grads[0].shape.num_elements()
                payloads = []
                for k, (grad, device) in enumerate(zip(grads, devices)):
                    with tf.device(device):
                        payloads.append(self.encode(k, v, tf.reshape(grad, [-1])))
                # One all-gather per part of the payload (values, indices, ...).
                parts = [all_gather([p[i] for p in payloads], devices, destinations)
                         for i in range(len(payloads[0]))]
                for d, destination in enumerate(destinations):
                    arrived = [tuple(part[d][k] for part in parts) for k in range(n)]
                    with tf.device(destination):
                        total = self.decompress(arrived, size)
                        mean = total / tf.cast(n, total.dtype)
                        out[d].append(tf.reshape(mean, tf.shape(grads[0])))
        return out

    def traffic(self, devices: Sequence[str], destinations: Sequence[str],
                nbytes: int) -> dict[str, int] | None:
        """Bytes each device sends per call for the built context: its payload
        to every destination but itself."""
        per_tower = sum(self.payload_bytes(s, d)
                        for s, d in zip(self.context.shapes, self.context.dtypes))
        sent = {device: per_tower * sum(1 for d in destinations if d != device)
                for device in devices}
        return {device: count for device, count in sent.items() if count}
