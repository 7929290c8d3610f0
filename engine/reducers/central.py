"""central: every tower sends its gradients to one device, which averages them.

The reduce device receives N x gradient bytes and sends the mean to every
destination that is not itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

from engine import scopes
from engine.reducers.base import Link, mean


@dataclasses.dataclass(frozen=True)
class Central:
    device: str
    link: Link = dataclasses.field(default_factory=Link)

    def __call__(self, tower_grads, devices, destinations):
        with tf.name_scope(scopes.REDUCE):
            means = []
            for grads in zip(*tower_grads):
                arrived = [
                    g if device == self.device else self.link.send(g, device, self.device)
                    for g, device in zip(grads, devices)
                ]
                with tf.device(self.device):
                    means.append(mean(arrived))
            return [
                means if d == self.device else [self.link.send(m, self.device, d) for m in means]
                for d in destinations
            ]

    def traffic(self, devices: Sequence[str], destinations: Sequence[str],
                nbytes: int) -> dict[str, int]:
        """Bytes each device sends in one call on float32 gradients of `nbytes`:
        the gradient from every tower but the reduce device, the mean from the
        reduce device to every destination but itself."""
        wire = self.link.wire_bytes(nbytes)
        sent = {device: wire for device in devices if device != self.device}
        returned = sum(1 for d in destinations if d != self.device)
        if returned:
            sent[self.device] = returned * wire
        return sent
