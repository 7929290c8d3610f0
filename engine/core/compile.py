"""What XLA compiles of a step, decided once from the placement.

When the towers, the variables and the reduce device are one device (one
tower whose variables live on it), the whole step after the input (forward,
backward, reduction, loss scale, the non-finite skip, the update and the
metric sums) is one compiled program, as Keras' `jit_compile` compiles its
train step: nothing in it waits on the host. Otherwise each tower's forward
and backward is one cluster on its device; the cluster reads the variables
itself, so they must be on the tower's device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class CompilePolicy:
    """Args:
      xla: compile with XLA at all.
      one_device: the towers, variables and reduce device are one device.
    """

    xla: bool
    one_device: bool

    @property
    def whole_step(self) -> bool:
        """The update after the input is one compiled program."""
        return self.xla and self.one_device

    def tower(self, function: Callable) -> Callable:
        """A tower's forward and backward: one compiled function (traced once
        per model copy it is given) where only the towers are compiled."""
        if self.xla and not self.whole_step:
            return tf.function(function, jit_compile=True)
        return function

    def step(self, function: Callable) -> Callable:
        """The update or evaluation after the input: compiled whole, or left
        to the tf.function that calls it."""
        return tf.function(function, jit_compile=True) if self.whole_step else function
