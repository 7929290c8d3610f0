"""What a step gives: the towers' reduced work (`Reduced`) and the typed
outputs of a training step for the host (`StepOutputs`), with each output's
dtype for a loop that stacks them.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

__all__ = ["GRAD_NORM", "OUTPUT_DTYPES", "Reduced", "StepOutputs", "TOP_K"]


class Reduced(NamedTuple):
    """What the towers computed together on one step."""

    grads: list[list[tf.Tensor]]  # one list per destination of the variable mode
    loss: tf.Tensor  # mean over towers
    correct: tf.Tensor  # total over towers
    finite: tf.Tensor  # [towers] bool
    top_k_correct: tf.Tensor  # total over towers


class StepOutputs(NamedTuple):
    """What one training step gives the host (stacked [count, ...] from a
    loop of steps); `grad_norm` only with `clip_norm`, `top_k_accuracy`
    only with `top_k`, else None."""

    loss: tf.Tensor  # float32, the mean over towers
    accuracy: tf.Tensor  # float64
    finite: tf.Tensor  # [towers] bool: each tower's loss and gradients finite
    overflow: tf.Tensor  # bool: the loss scale overflowed (a routine skip)
    learning_rate: tf.Tensor  # float32: the rate this step's update used
    grad_norm: tf.Tensor | None = None  # float32: before clipping
    top_k_accuracy: tf.Tensor | None = None  # float64


# Each output's dtype, in the order of StepOutputs.
OUTPUT_DTYPES = StepOutputs(tf.float32, tf.float64, tf.bool, tf.bool, tf.float32,
                            tf.float32, tf.float64)
GRAD_NORM = StepOutputs._fields.index("grad_norm")
TOP_K = StepOutputs._fields.index("top_k_accuracy")
