"""ring: chunked ring all-reduce, reduce-scatter then all-gather.

Each device's buffer is cut into N chunks. In N-1 reduce-scatter hops device i
sends one chunk to device i+1, which adds it to its own; afterwards device i
holds the full sum of chunk i, divides it by the tower count, and N-1
all-gather hops pass the finished chunks around the ring. Every hop is an op
placed on the receiving device; each device sends 2(N-1)/N of the buffer.

The two phases are collectives of their own (engine.reducers.primitives).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine.reducers.base import Link, split_even


def ring_reduce_scatter(
    flats: list[tf.Tensor], devices: Sequence[str], link: Link, divisor: int | None = None,
) -> list[tf.Tensor]:
    """Chunk i of the mean of `flats` (1-D, one per device) on device i.

    The chunks are `split_even`'s; `divisor` defaults to the number of devices.
    """
    n = len(devices)
    divisor = divisor or n
    chunks = []
    for flat, device in zip(flats, devices):
        with tf.device(device):
            chunks.append(split_even(flat, n))
    for hop in range(n - 1):
        sent = [list(c) for c in chunks]
        for i in range(n):
            # Chunk c starts at device c+1 and ends, whole, at device c.
            c, dst = (i - hop - 1) % n, (i + 1) % n
            arrived = link.send(sent[i][c], devices[i], devices[dst])
            with tf.device(devices[dst]):
                chunks[dst][c] = sent[dst][c] + arrived
    out = []
    for i, device in enumerate(devices):
        with tf.device(device):
            out.append(chunks[i][i] / tf.cast(divisor, chunks[i][i].dtype))
    return out


def ring_all_gather(chunks: list[tf.Tensor], devices: Sequence[str], link: Link) -> list[tf.Tensor]:
    """Every device's chunk, concatenated in device order, on every device."""
    n = len(devices)
    held = [[None] * n for _ in range(n)]
    for i in range(n):
        held[i][i] = chunks[i]
    for hop in range(n - 1):
        for i in range(n):
            c, dst = (i - hop) % n, (i + 1) % n
            held[dst][c] = link.send(held[i][c], devices[i], devices[dst])
    results = []
    for i, device in enumerate(devices):
        with tf.device(device):
            results.append(tf.concat(held[i], axis=0) if n > 1 else tf.identity(held[i][0]))
    return results


def ring_all_reduce(
    flats: list[tf.Tensor],
    devices: Sequence[str],
    link: Link,
    divisor: int | None = None,
) -> list[tf.Tensor]:
    """The mean of `flats` (1-D, one per device) on every device.

    `divisor` defaults to the number of devices; hierarchical reduction passes
    the number of towers behind them.
    """
    if len(devices) == 1:
        with tf.device(devices[0]):
            return [flats[0] / tf.cast(divisor or 1, flats[0].dtype)]
    return ring_all_gather(ring_reduce_scatter(flats, devices, link, divisor), devices, link)


def ring_traffic(devices: Sequence[str], nbytes: int) -> dict[str, int]:
    """Bytes each device sends in a ring all-reduce of `nbytes` per device.

    2(N-1) hops of one chunk of nbytes/N: exact when N divides the elements.
    """
    n = len(devices)
    return {device: 2 * (n - 1) * nbytes // n for device in devices}
