"""Collectives for reducer authors, made of explicit hops.

Every hop is a `Link.send` (a `tf.identity` under `tf.device` of the
receiving device, or a cast down on the sender and back on the receiver), so
the placement log sees each transfer as a _Send/_Recv pair and counts its
bytes. The tensors of one call are one per tower, `tensors[k]` on
`devices[k]`:

* `all_reduce`: the mean of equal-shaped tensors on every destination, by
  one of ALGORITHMS;
* `all_gather`: every tower's tensor on every destination (top-k values and
  their indices, packed signs: data that cannot be summed on the way);
* `reduce_scatter`: chunk k of the mean of flat tensors on tower k;
* `broadcast`: one tensor on every destination.

Bytes sent, with T bytes per tower's tensor, N towers and D destinations
that are towers (replicated variables):

    all_reduce ring/tree   2 (N-1) T in all (2 (N-1)/N T per device)
    all_reduce central     (N-1) T to the first tower, (N-1) T back
    all_gather             N (D-1) T: each tower to every other destination
    reduce_scatter         (N-1) T in all
    broadcast              T per destination other than the source
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine.reducers.base import Link, mean
from engine.reducers.ring import ring_all_reduce, ring_reduce_scatter
from engine.reducers.tree import halving_doubling

__all__ = ["ALGORITHMS", "all_gather", "all_reduce", "broadcast", "reduce_scatter"]

ALGORITHMS = ("ring", "tree", "central")
"""The schedules `all_reduce` and its kin take as `algorithm=`."""
_PLAIN = Link()


def _central(flats, devices, link):
    """Everything to the first device, the mean back to the others."""
    arrived = [flats[0]] + [link.send(f, d, devices[0]) for f, d in zip(flats[1:], devices[1:])]
    with tf.device(devices[0]):
        result = mean(arrived)
    return [result] + [link.send(result, devices[0], d) for d in devices[1:]]


_ALL_REDUCES = {
    "ring": lambda flats, devices, link: ring_all_reduce(flats, devices, link),
    "tree": halving_doubling,
    "central": _central,
}


def all_reduce(
    tensors: Sequence[tf.Tensor],
    devices: Sequence[str],
    destinations: Sequence[str] | None = None,
    *,
    algorithm: str = "ring",
    link: Link = _PLAIN,
) -> list[tf.Tensor]:
    """The mean of `tensors` (one per device, of one shape) on each destination.

    Args:
      tensors: tensors[k], on devices[k].
      devices: the towers' devices.
      destinations: where the mean is wanted; default: every device. A
        destination that is no device gets the first device's result.
      algorithm: one of ALGORITHMS, or a function of (flats, devices, link)
        that returns the mean of the 1-D `flats` on every device.
      link: how the hops travel (with `compress`, in a narrower dtype).

    Returns:
      The mean, in the tensors' shape, one per destination, made there.

    Raises:
      ValueError: an unknown `algorithm`, or tensors and devices that differ
        in number.
    """
    if not callable(algorithm) and algorithm not in _ALL_REDUCES:
        raise ValueError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    _check_aligned(tensors, devices)
    destinations = list(devices if destinations is None else destinations)
    flats = []
    for tensor, device in zip(tensors, devices):
        with tf.device(device):
            flats.append(tf.reshape(tensor, [-1]))
    run = algorithm if callable(algorithm) else _ALL_REDUCES[algorithm]
    results = run(flats, list(devices), link)
    out = []
    for destination in destinations:
        if destination in devices:
            source = results[list(devices).index(destination)]
        else:
            source = link.send(results[0], devices[0], destination)
        with tf.device(destination):
            out.append(tf.reshape(source, tf.shape(tensors[0])))
    return out


def all_gather(
    tensors: Sequence[tf.Tensor],
    devices: Sequence[str],
    destinations: Sequence[str] | None = None,
    *,
    link: Link = _PLAIN,
) -> list[list[tf.Tensor]]:
    """Every tower's tensor on every destination, sent directly (one hop each).

    Args:
      tensors: tensors[k], on devices[k]; of one shape and dtype, so that
        what each destination receives is known before the call.
      devices: the towers' devices.
      destinations: default: every device.
      link: how the hops travel.

    Returns:
      `out[d][k]`: tower k's tensor on `destinations[d]`.

    Raises:
      ValueError: tensors of different shapes or dtypes, or not one per device.
    """
    _check_aligned(tensors, devices)
    shapes = {tuple(t.shape.as_list()) for t in tensors}
    dtypes = {t.dtype for t in tensors}
    if len(shapes) > 1 or len(dtypes) > 1:
        raise ValueError(
            f"all_gather takes tensors of one shape and dtype; got shapes {sorted(shapes)} "
            f"and dtypes {sorted(d.name for d in dtypes)}"
        )
    destinations = list(devices if destinations is None else destinations)
    return [
        [t if device == destination else link.send(t, device, destination)
         for t, device in zip(tensors, devices)]
        for destination in destinations
    ]


def reduce_scatter(
    tensors: Sequence[tf.Tensor], devices: Sequence[str], *, link: Link = _PLAIN
) -> list[tf.Tensor]:
    """Chunk k of the mean of `tensors`, flattened, on devices[k] (a ring).

    Args:
      tensors: tensors[k], on devices[k], of one shape.
      devices: the towers' devices.
      link: how the hops travel.

    Returns:
      One 1-D chunk per device, made there: the flattened mean cut into
      len(devices) contiguous parts whose sizes differ by at most one
      (`engine.reducers.base.split_even`).

    Raises:
      ValueError: not one tensor per device.
    """
    _check_aligned(tensors, devices)
    flats = []
    for tensor, device in zip(tensors, devices):
        with tf.device(device):
            flats.append(tf.reshape(tensor, [-1]))
    if len(devices) == 1:
        with tf.device(devices[0]):
            return [tf.identity(flats[0])]
    return ring_reduce_scatter(flats, list(devices), link)


def broadcast(
    tensor: tf.Tensor, source: str, destinations: Sequence[str], *, link: Link = _PLAIN
) -> list[tf.Tensor]:
    """`tensor`, which lives on `source`, on each destination.

    Args:
      tensor: the tensor, made on `source`.
      source: its device.
      destinations: where it is wanted.
      link: how the hops travel.

    Returns:
      One tensor per destination: `tensor` itself where the destination is
      `source`, a copy made on the destination otherwise.
    """
    return [tensor if d == source else link.send(tensor, source, d) for d in destinations]


def _check_aligned(tensors, devices) -> None:
    if len(tensors) != len(devices):
        raise ValueError(f"{len(tensors)} tensors for {len(devices)} devices; pass one per device")
