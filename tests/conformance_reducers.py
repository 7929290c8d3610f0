"""Reducers that break the contract, each in one way, for tests/test_conformance.py.

Loaded in-process and by `tower-reduce-bench --check tests.conformance_reducers:NAME`.
"""

import tensorflow as tf


def _deliver(results, destinations):
    """The same results, copied onto each destination."""
    out = []
    for destination in destinations:
        with tf.device(destination):
            out.append([tf.identity(r) for r in results])
    return out


def summed(tower_grads, devices, destinations):
    """The sum over towers: forgets to divide by len(devices)."""
    with tf.device(devices[0]):
        sums = [tf.add_n(list(grads)) for grads in zip(*tower_grads)]
    return _deliver(sums, destinations)


def flattened(tower_grads, devices, destinations):
    """The mean, flattened to 1-D: forgets to reshape."""
    with tf.device(devices[0]):
        means = [tf.reshape(tf.add_n(list(g)) / len(devices), [-1]) for g in zip(*tower_grads)]
    return _deliver(means, destinations)


def powers_of_two(tower_grads, devices, destinations):
    """The mean, for a tower count that is a power of two; raises otherwise."""
    n = len(devices)
    if n & (n - 1):
        raise ValueError(f"{n} towers: this reducer needs a power of two of them\n"
                         "(a second line, which reports leave out)")
    with tf.device(devices[0]):
        means = [tf.add_n(list(grads)) / n for grads in zip(*tower_grads)]
    return _deliver(means, destinations)


def left_on_first(tower_grads, devices, destinations):
    """The mean, left on the first tower's device for every destination."""
    with tf.device(devices[0]):
        means = [tf.add_n(list(grads)) / len(devices) for grads in zip(*tower_grads)]
    return [list(means) for _ in destinations]


class _RingClaims:
    """Gathers on the first device, but declares the traffic of a ring."""

    def __call__(self, tower_grads, devices, destinations):
        with tf.device(devices[0]):
            means = [tf.add_n(list(grads)) / len(devices) for grads in zip(*tower_grads)]
        return _deliver(means, destinations)

    def traffic(self, devices, destinations, nbytes):
        n = len(devices)
        return {device: 2 * (n - 1) * nbytes // n for device in devices}


claims_ring = _RingClaims()
