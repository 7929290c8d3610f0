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
