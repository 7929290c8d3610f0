"""Gradient reduction: from every tower's gradients to one averaged list.

A reducer is one call, `reducer(tower_grads, devices) -> grads`: `tower_grads`
holds one gradient list per tower (same variable order), `devices` the towers'
devices; it returns the mean gradient per variable, placing every op it makes
with `tf.device`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import tensorflow as tf

from engine import scopes


class Reducer(Protocol):
    def __call__(
        self, tower_grads: Sequence[Sequence[tf.Tensor]], devices: Sequence[str]
    ) -> list[tf.Tensor]: ...


def mean(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """The mean of same-shaped tensors: add_n, then divide by their count."""
    total = tf.add_n([tf.convert_to_tensor(t) for t in tensors])
    return total / tf.cast(len(tensors), total.dtype)


@dataclasses.dataclass(frozen=True)
class CentralMean:
    """Averages every gradient on one device, the one that holds the variables."""

    reduce_device: str

    def __call__(self, tower_grads, devices):
        _check_aligned(tower_grads, devices)
        with tf.device(self.reduce_device), tf.name_scope(scopes.REDUCE):
            return [mean(grads) for grads in zip(*tower_grads)]


def _check_aligned(tower_grads, devices) -> None:
    if len(tower_grads) != len(devices):
        raise ValueError(
            f"{len(tower_grads)} gradient lists for {len(devices)} tower devices"
        )
    sizes = {len(g) for g in tower_grads}
    if len(sizes) > 1:
        raise ValueError(f"towers returned different numbers of gradients: {sizes}")
    for grads in zip(*tower_grads):
        if any(g is None for g in grads):
            raise ValueError(
                "a tower returned no gradient for a trainable variable; every "
                "trainable variable must take part in the loss"
            )
