"""tree: recursive halving-doubling all-reduce (Rabenseifner's algorithm).

With P devices, P a power of two, log2(P) halving steps pair device i with
i XOR d (d = P/2, P/4, ... 1): each keeps half of its current range, sends the
other half to its partner and adds the partner's half of its own. Device i
ends with the whole sum of chunk i; log2(P) doubling steps (d = 1, 2, ...)
exchange finished ranges until every device has everything. Each device sends
2(P-1)/P of the buffer in 2 log2(P) steps.

Tower counts that are not a power of two are served by folding: the devices
past the largest power of two first add their buffer into a partner's, sit
out the exchange, and receive the result at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine.reducers.base import Link, split_even


def halving_doubling(
    flats: list[tf.Tensor], devices: Sequence[str], link: Link
) -> list[tf.Tensor]:
    """The mean of `flats` (1-D, one per device) on every device."""
    n = len(devices)
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n
    buffers = list(flats[:p])
    for extra in range(p, n):  # fold the devices past p into partners
        partner = extra - p
        arrived = link.send(flats[extra], devices[extra], devices[partner])
        with tf.device(devices[partner]):
            buffers[partner] = buffers[partner] + arrived
    chunks = []
    for i in range(p):
        with tf.device(devices[i]):
            chunks.append(split_even(buffers[i], p))
    ranges = [(0, p)] * p
    d = p // 2
    while d >= 1:  # recursive halving: reduce-scatter
        sent, kept = [list(c) for c in chunks], []
        for i in range(p):
            lo, hi = ranges[i]
            mid = (lo + hi) // 2
            keep = (lo, mid) if i & d == 0 else (mid, hi)
            for c in range(*keep):
                arrived = link.send(sent[i ^ d][c], devices[i ^ d], devices[i])
                with tf.device(devices[i]):
                    chunks[i][c] = sent[i][c] + arrived
            kept.append(keep)
        ranges, d = kept, d // 2
    for i in range(p):  # device i holds the whole sum of chunk i
        with tf.device(devices[i]):
            chunks[i][i] = chunks[i][i] / tf.cast(n, chunks[i][i].dtype)
    d = 1
    while d < p:  # recursive doubling: all-gather
        sent, merged = [list(c) for c in chunks], []
        for i in range(p):
            (lo, hi), (plo, phi) = ranges[i], ranges[i ^ d]
            for c in range(plo, phi):
                chunks[i][c] = link.send(sent[i ^ d][c], devices[i ^ d], devices[i])
            merged.append((min(lo, plo), max(hi, phi)))
        ranges, d = merged, d * 2
    results = []
    for i in range(p):
        with tf.device(devices[i]):
            results.append(tf.concat(chunks[i], axis=0))
    for extra in range(p, n):  # hand the folded devices their result
        results.append(link.send(results[extra - p], devices[extra - p], devices[extra]))
    return results


def halving_doubling_traffic(devices: Sequence[str], nbytes: int) -> dict[str, int]:
    """Bytes each device sends in `halving_doubling` of `nbytes` per device.

    The P devices of the exchange send 2(P-1)/P x nbytes each (exact when P
    divides the elements); a folded device sends its whole buffer to its
    partner, which sends the whole result back.
    """
    n = len(devices)
    p = 1 << (n.bit_length() - 1)
    sent = {device: 2 * (p - 1) * nbytes // p for device in devices[:p]}
    for extra in range(p, n):
        sent[devices[extra]] = nbytes
        sent[devices[extra - p]] += nbytes
    return sent
