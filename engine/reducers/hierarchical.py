"""hierarchical: reduce inside groups of towers, then across the groups.

Towers are grouped in order, `group_size` at a time (the last group may be
smaller). Each group sums onto its first device (the leader); the leaders run
a ring all-reduce of the group sums, dividing by the total tower count; each
leader then sends the mean to the rest of its group. With groups that match
the hardware (the GPUs of one host, or of one NVLink island) only the leaders
talk across the slow links.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine.reducers.base import Link
from engine.reducers.ring import ring_all_reduce


def groups_of(count: int, group_size: int) -> list[list[int]]:
    """Tower indices in consecutive groups of `group_size`."""
    return [list(range(i, min(i + group_size, count))) for i in range(0, count, group_size)]


def hierarchical_all_reduce(
    flats: list[tf.Tensor], devices: Sequence[str], link: Link, group_size: int
) -> list[tf.Tensor]:
    """The mean of `flats` (1-D, one per device) on every device."""
    groups = groups_of(len(devices), group_size)
    leaders = [devices[g[0]] for g in groups]
    sums = []
    for group, leader in zip(groups, leaders):
        parts = [flats[group[0]]] + [link.send(flats[k], devices[k], leader) for k in group[1:]]
        with tf.device(leader):
            sums.append(tf.add_n(parts))
    means = ring_all_reduce(sums, leaders, link, divisor=len(devices))
    results = [None] * len(devices)
    for group, leader, leader_mean in zip(groups, leaders, means):
        results[group[0]] = leader_mean
        for k in group[1:]:
            results[k] = link.send(leader_mean, leader, devices[k])
    return results
