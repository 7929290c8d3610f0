"""A user's own reducer, loaded by the CLI tests as tests.user_reducers:gather_on_first.

The contract (README, "Your own reducer"): take every tower's gradients and
devices, return the mean for each destination device, placed there.
"""

import tensorflow as tf


def gather_on_first(tower_grads, devices, destinations):
    """Average on the first tower's device, then copy to each destination."""
    with tf.device(devices[0]):
        means = [tf.add_n(list(grads)) / len(devices) for grads in zip(*tower_grads)]
    out = []
    for destination in destinations:
        with tf.device(destination):
            out.append([tf.identity(m) for m in means])
    return out


def summed(tower_grads, devices, destinations):
    """Wrong on purpose: the sum of the towers' gradients, not their mean."""
    with tf.device(devices[0]):
        sums = [tf.add_n(list(grads)) for grads in zip(*tower_grads)]
    out = []
    for destination in destinations:
        with tf.device(destination):
            out.append([tf.identity(s) for s in sums])
    return out


def two_arguments(tower_grads, devices):
    """Wrong on purpose: the contract passes destinations too."""
    return [list(tower_grads[0])]


def raises(tower_grads, devices, destinations):
    """Wrong on purpose: fails while the step is traced."""
    raise ValueError("no reduction for you")
