"""Loss scaling for float16 towers: none, or a dynamic scale on the reduce device.

float16 gradients underflow to zero below about 6e-8; multiplying the loss by
a large scale before the backward pass keeps them representable, and each
tower divides its gradients by the same scale before they are reduced (so a
reducer, `compress` included, sees ordinary magnitudes). Too large a scale
overflows to inf: that step is skipped and the scale halved; after
`growth_interval` finite steps in a row it doubles (as Keras'
LossScaleOptimizer does, but the skip is the step's own, shared with
every other non-finite step).

A non-finite *loss* is not the scale's doing (the loss is computed in float32
before scaling): the scale leaves such a step to the non-finite guard, and so
it does once the scale is down to `minimum`.
"""

from __future__ import annotations

import tensorflow as tf

from engine import scopes
from engine.errors import UsageError

INITIAL = 2.0**15  # Keras' LossScaleOptimizer starts here too
GROWTH_INTERVAL = 2000


def next_scale(
    scale: tf.Tensor,
    good_steps: tf.Tensor,
    grads_finite: tf.Tensor,
    loss_finite: tf.Tensor,
    *,
    growth_interval: int,
    minimum: float,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(scale, good_steps, overflow) after one step.

    `overflow` is true when the gradients were not finite but the loss was,
    and the scale could still be halved: the scale caused it and has handled
    it. A step with finite gradients counts towards growth; any other step
    leaves both unchanged.
    """
    overflow = tf.logical_and(
        tf.logical_and(tf.logical_not(grads_finite), loss_finite), scale > minimum
    )
    counted = tf.where(grads_finite, good_steps + 1, good_steps)
    grow = counted >= growth_interval
    new_scale = tf.where(
        overflow,
        tf.maximum(scale / 2.0, minimum),
        tf.where(grow, scale * 2.0, scale),
    )
    new_good = tf.where(tf.logical_or(overflow, grow), tf.zeros_like(good_steps), counted)
    return new_scale, new_good, overflow


class NoLossScale:
    """float32 and bfloat16 towers: the loss is used as it is."""

    dynamic = False

    def value(self) -> None:
        return None

    def update(self, grads_finite: tf.Tensor, loss_finite: tf.Tensor,
               allowed: tf.Tensor | bool = True) -> tf.Tensor:
        return tf.constant(False)

    def trackables(self) -> dict:
        return {}


class DynamicLossScale:
    """The scale and its counters, variables on `device` (the reduce device).

    Args:
      device: where the variables live and the update runs.
      initial: the first scale (Keras' default, 2**15).
      growth_interval: finite steps in a row before the scale doubles.
      minimum: the scale is never halved below this.
    """

    dynamic = True

    def __init__(
        self,
        device: str,
        *,
        initial: float = INITIAL,
        growth_interval: int = GROWTH_INTERVAL,
        minimum: float = 1.0,
    ):
        if not initial >= minimum > 0:
            raise UsageError(
                f"loss scale: <initial> ({initial}) must be at least <minimum> ({minimum}), "
                "and minimum positive"
            )
        if growth_interval < 1:
            raise UsageError(f"loss scale: <growth_interval> ({growth_interval}) must be >= 1")
        self.device = device
        self.growth_interval = growth_interval
        self.minimum = minimum
        with tf.device(device):
            self.scale = tf.Variable(initial, dtype=tf.float32, trainable=False)
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
            # Steps skipped because the scale overflowed (not counted as skipped).
            self.overflows = tf.Variable(0, dtype=tf.int64, trainable=False)

    def value(self) -> tf.Tensor:
        with tf.device(self.device):
            return self.scale.read_value()

    def update(self, grads_finite: tf.Tensor, loss_finite: tf.Tensor,
               allowed: tf.Tensor | bool = True) -> tf.Tensor:
        """Moves the scale after a step, unless `allowed` is false; returns
        whether it overflowed."""
        with tf.device(self.device), tf.name_scope(scopes.UPDATE):
            old = (self.scale.read_value(), self.good_steps.read_value())
            scale, good, overflow = next_scale(
                *old,
                grads_finite,
                loss_finite,
                growth_interval=self.growth_interval,
                minimum=self.minimum,
            )
            overflow = tf.logical_and(overflow, allowed)
            self.scale.assign(tf.where(allowed, scale, old[0]))
            self.good_steps.assign(tf.where(allowed, good, old[1]))
            self.overflows.assign_add(tf.cast(overflow, tf.int64))
            return overflow

    def trackables(self) -> dict:
        return {"loss_scale": [self.scale, self.good_steps, self.overflows]}
