"""central: every tower sends its gradients to one device, which averages them.

The reduce device receives N x gradient bytes and sends the mean to every
destination that is not itself.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from engine.core import scopes
from engine.reducers.base import Link, check_towers, mean


@dataclasses.dataclass(frozen=True)
class Central:
    device: str
    link: Link = Link()

    def __call__(self, tower_grads, devices, destinations):
        check_towers(tower_grads, devices)
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
