"""Reducers made from an all-reduce on flat buffers: ring, tree, hierarchical,
collective and nccl are each one algorithm behind `FlatReducer`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from engine import scopes
from engine.reducers.base import Link
from engine.reducers.primitives import all_reduce

# An all-reduce on flat buffers: one 1-D tensor per device in, the mean of
# them out on every device.
AllReduce = Callable[[list[tf.Tensor], Sequence[str]], list[tf.Tensor]]
# An all-reduce's traffic: (devices, bytes of each device's buffer) -> bytes
# each device sends (conformance.py).
AllReduceTraffic = Callable[[Sequence[str], int], dict[str, int]]


def reduce_flat(
    algorithm: AllReduce,
    tower_grads,
    devices: Sequence[str],
    destinations: Sequence[str],
    link: Link,
) -> list[list[tf.Tensor]]:
    """Runs `algorithm` per variable on flattened gradients, then delivers
    (primitives.all_reduce): a destination that is one of the devices takes
    that device's result; any other takes the first device's over `link`."""
    out = [[] for _ in destinations]
    for grads in zip(*tower_grads):
        means = all_reduce(
            grads, devices, destinations,
            algorithm=lambda flats, devices, _link: algorithm(flats, devices), link=link,
        )
        for d, result in enumerate(means):
            out[d].append(result)
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

    def traffic(self, devices: Sequence[str], destinations: Sequence[str],
                nbytes: int) -> dict[str, int] | None:
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
