"""The reducer contract, and the pieces every built-in shares.

A reducer is one call:

    reducer(tower_grads, devices, destinations) -> reduced

* `tower_grads[k][v]`: tower k's gradient for variable v, on `devices[k]`.
* `destinations`: the devices that need the mean: the reduce device when the
  variables live there, every tower's device when they are replicated.
* `reduced[d][v]`: the mean over towers (never the sum) of variable v's
  gradient, placed on `destinations[d]`.

Every op a reducer makes is placed with `tf.device`. The built-ins run on flat
1-D buffers: `reduce_flat` flattens each variable's gradients, hands them to
an algorithm and reshapes the results on each destination.

A reducer may also declare the bytes it moves with a `traffic` method; the
contract, and the check that measures a reducer against it, are in
conformance.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

import tensorflow as tf

from engine.core import scopes
from engine.errors import UsageError

COMPRESSION = {"fp16": tf.float16, "bf16": tf.bfloat16}


class ReducerError(UsageError):
    """A reducer that cannot serve this placement; the message is one line."""


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


# An all-reduce on flat buffers: one 1-D tensor per device in, the mean of
# them out on every device.
AllReduce = Callable[[list[tf.Tensor], Sequence[str]], list[tf.Tensor]]
# An all-reduce's traffic: (devices, bytes of each device's buffer) -> bytes
# each device sends (conformance.py).
AllReduceTraffic = Callable[[Sequence[str], int], dict[str, int]]


def reduce_flat(
    all_reduce: AllReduce,
    tower_grads,
    devices: Sequence[str],
    destinations: Sequence[str],
    link: Link,
) -> list[list[tf.Tensor]]:
    """Runs `all_reduce` per variable on flattened gradients, then delivers.

    A destination that is one of the devices takes that device's result; any
    other takes the first device's result over `link`.
    """
    check_towers(tower_grads, devices)
    out = [[] for _ in destinations]
    for grads in zip(*tower_grads):
        flats = []
        for grad, device in zip(grads, devices):
            with tf.device(device):
                flats.append(tf.reshape(grad, [-1]))
        results = all_reduce(flats, devices)
        for d, destination in enumerate(destinations):
            if destination in devices:
                source = results[list(devices).index(destination)]
            else:
                source = link.send(results[0], devices[0], destination)
            with tf.device(destination):
                out[d].append(tf.reshape(source, tf.shape(grads[0])))
    return out


@dataclasses.dataclass(frozen=True)
class FlatReducer:
    """A reducer made from an all-reduce on flat buffers (see reduce_flat).

    Attributes:
      all_reduce: the algorithm.
      link: how results travel to destinations that are not towers.
      all_reduce_traffic: the algorithm's figure of bytes sent per device, or
        None when it has none (its transfers are not _Send ops, say).
    """

    all_reduce: AllReduce
    link: Link = Link()
    all_reduce_traffic: AllReduceTraffic | None = None

    def __call__(self, tower_grads, devices, destinations):
        with tf.name_scope(scopes.REDUCE):
            return reduce_flat(self.all_reduce, tower_grads, devices, destinations, self.link)

    def traffic(self, devices, destinations, nbytes) -> dict[str, int] | None:
        """Bytes each device sends in one call on float32 gradients of `nbytes`.

        None without a figure, or when some tower is no destination: then
        TensorFlow prunes the hops whose results no one needs, and how many
        depends on the algorithm's routing.
        """
        if self.all_reduce_traffic is None or not set(devices) <= set(destinations):
            return None
        sent = self.all_reduce_traffic(devices, self.link.wire_bytes(nbytes))
        others = sum(1 for d in destinations if d not in devices)
        if others:  # reduce_flat sends the first device's result to each
            sent[devices[0]] = sent.get(devices[0], 0) + others * self.link.wire_bytes(nbytes)
        return sent
