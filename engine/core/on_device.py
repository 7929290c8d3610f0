"""Calling a `tf.function` under a device, so that its unplaced ops run there."""

from __future__ import annotations

import tensorflow as tf


class OnDevice:
    """A `tf.function` that is always called under `device`.

    TensorFlow runs the ops of a function that have no device of their own
    (its outputs' Identity nodes, the control plumbing partitioning adds) on
    the device of the call, and an unscoped call goes to the default device:
    GPU 0 on a GPU host, even when every tower is a CPU (seen on an H200).
    Called under the reduce device, they run where the step's own
    bookkeeping does.
    """

    def __init__(self, function, device: str):
        self.function = function
        self.device = device

    def __call__(self, *args):
        with tf.device(self.device):
            return self.function(*args)

    def get_concrete_function(self, *args):
        with tf.device(self.device):
            return self.function.get_concrete_function(*args)
