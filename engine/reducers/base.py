"""The reducer contract, and the pieces every built-in shares.

A reducer is one call:

    reducer(tower_grads, devices, destinations) -> reduced

* `tower_grads[k][v]`: tower k's gradient for variable v, on `devices[k]`.
* `destinations`: the devices that need the mean: the reduce device when the
  variables live there, every tower's device when they are replicated.
* `reduced[d][v]`: the mean over towers (never the sum) of variable v's
  gradient, placed on `destinations[d]`.

Every op a reducer makes is placed with `tf.device`. The all-reduce built-ins
run on flat 1-D buffers (flat.py); stateful reducers (stateful.py) are built
once for the gradients they will see and keep tf.Variables between calls.

A reducer may also declare the bytes it moves with a `traffic` method; the
contract, and the check that measures a reducer against it, are in
conformance.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import tensorflow as tf

from engine.reducers.options import ReducerError  # noqa: F401 (where reducers import it)

COMPRESSION = {"fp16": tf.float16, "bf16": tf.bfloat16}


class Reducer(Protocol):
    def __call__(
        self,
        tower_grads: Sequence[Sequence[tf.Tensor]],
        devices: Sequence[str],
        destinations: Sequence[str],
    ) -> list[list[tf.Tensor]]: ...


@dataclasses.dataclass(frozen=True)
class Link:
    """Moves a tensor to a device; with `compress`, in a narrower dtype.

    The cast down runs on the sending device and the cast back on the
    receiving one, so only the transfer is narrow: sums stay in the gradient's
    own dtype.
    """

    compress: str | None = None

    def send(self, tensor: tf.Tensor, source: str, device: str) -> tf.Tensor:
        """`tensor`, which lives on `source`, as a tensor on `device`."""
        narrow = COMPRESSION.get(self.compress)
        if narrow is None or not tensor.dtype.is_floating or tensor.dtype == narrow:
            with tf.device(device):
                return tf.identity(tensor)
        with tf.device(source):
            packed = tf.cast(tensor, narrow)
        with tf.device(device):
            return tf.cast(packed, tensor.dtype)

    def wire_bytes(self, nbytes: int) -> int:
        """Bytes a send of `nbytes` of float32 puts on the wire through this link."""
        narrow = COMPRESSION.get(self.compress)
        return nbytes if narrow is None else nbytes * narrow.size // 4


def mean(tensors: Sequence[tf.Tensor], count: int | None = None) -> tf.Tensor:
    """add_n of same-shaped tensors divided by `count` (default: how many)."""
    total = tf.add_n(list(tensors))
    return total / tf.cast(count or len(tensors), total.dtype)


def split_even(flat: tf.Tensor, parts: int) -> list[tf.Tensor]:
    """`flat` in `parts` contiguous chunks whose sizes differ by at most one."""
    size = int(flat.shape[0])
    sizes = [size // parts + (1 if i < size % parts else 0) for i in range(parts)]
    return tf.split(flat, sizes) if parts > 1 else [flat]


def check_towers(tower_grads, devices) -> None:
    """The shared sanity checks: one list per device, aligned, no None."""
    if len(tower_grads) != len(devices):
        raise ValueError(f"{len(tower_grads)} gradient lists for {len(devices)} devices")
    sizes = {len(g) for g in tower_grads}
    if len(sizes) > 1:
        raise ValueError(f"towers returned different numbers of gradients: {sorted(sizes)}")
    if any(g is None for grads in tower_grads for g in grads):
        raise ReducerError(
            "a tower returned no gradient for a trainable variable; every "
            "trainable variable must take part in the loss"
        )
