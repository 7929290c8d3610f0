"""Reducers against each other on a topology: predicted time, algbw and busbw per size.

Bandwidths follow nccl-tests: algbw = S / t for a tensor of S bytes per
tower; an all-reduce's busbw = algbw x 2 (n-1) / n (what each link must
carry); a reduce to one device has busbw = algbw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf

from engine.cost import model, schedule
from engine.cost.topology import Topology, TopologyError

__all__ = ["Row", "bus_factor", "crossover", "fastest", "predict_rows", "towers_of"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One reducer on one size.

    Attributes:
      reducer: its name.
      towers: how many towers.
      tensor_bytes: bytes of the tensor each tower holds.
      seconds: predicted time of one reduction.
      algbw: tensor bytes per second.
      busbw: algbw x the all-reduce's bus factor.
    """

    reducer: str
    towers: int
    tensor_bytes: int
    seconds: float
    algbw: float
    busbw: float


def bus_factor(towers: int, all_reduce: bool) -> float:
    """nccl-tests' factor from algbw to busbw.

    Args:
      towers: devices taking part.
      all_reduce: an all-reduce (every device gets the result), not a reduce.

    Returns:
      2(n-1)/n for an all-reduce of `towers` (`all_reduce`), 1 for a reduce.
    """
    return 2 * (towers - 1) / towers if all_reduce and towers > 1 else 1.0


def towers_of(topology: Topology) -> list[str]:
    """The default towers on a topology.

    Args:
      topology: the machine described.

    Returns:
      Its GPUs, or every device when it has none.
    """
    names = list(topology.devices)
    gpus = [d for d in names if topology.devices[d].kind == "gpu"]
    return gpus or names


def default_reduce_device(topology: Topology, towers: Sequence[str]) -> str:
    """The first host's first CPU device (tf_cnn_benchmarks' parameter server),
    or the first tower when the topology lists no CPU device."""
    cpus = [d.name for d in topology.hosts[0].devices if d.kind == "cpu"]
    return cpus[0] if cpus else towers[0]


def predict_seconds(reducer: Callable, topology: Topology, towers: Sequence[str],
                    destinations: Sequence[str], nbytes: int,
                    dtype: tf.DType = tf.float32) -> float:
    """Predicted seconds of `reducer` on one tensor of `nbytes` per tower."""
    traced = schedule.trace_reduction(reducer, towers, destinations,
                                      [max(1, nbytes // dtype.size)], dtype)
    return model.predict(traced, topology).seconds


def predict_rows(reducers: Mapping[str, Callable], topology: Topology, towers: Sequence[str],
                 destinations: Sequence[str], sizes: Sequence[int]) -> list[Row]:
    """Every reducer on every size (bytes of float32 per tower).

    Raises:
      TopologyError: a tower or destination the topology lacks.
    """
    for device in [*towers, *destinations]:
        if device not in topology.devices:
            raise TopologyError(
                f"topology {topology.name!r} has no device {device}; its devices: "
                f"{', '.join(topology.devices)}"
            )
    all_reduce = set(towers) <= set(destinations)
    factor = bus_factor(len(towers), all_reduce)
    rows = []
    for name, reducer in reducers.items():
        for nbytes in sizes:
            seconds = predict_seconds(reducer, topology, towers, destinations, nbytes)
            rows.append(Row(name, len(towers), nbytes, seconds, nbytes / seconds,
                            factor * nbytes / seconds))
    return rows


def fastest(rows: Sequence[Row]) -> dict[int, str]:
    """The reducer predicted fastest for each size.

    Args:
      rows: predictions, as `compare` gives them.

    Returns:
      {tensor bytes: reducer name}, by size.
    """
    best: dict[int, Row] = {}
    for row in rows:
        if row.tensor_bytes not in best or row.seconds < best[row.tensor_bytes].seconds:
            best[row.tensor_bytes] = row
    return {size: row.reducer for size, row in sorted(best.items())}


def crossover(first: Callable, second: Callable, topology: Topology, towers: Sequence[str],
              destinations: Sequence[str], low: int, high: int,
              precision: float = 0.05) -> int | None:
    """Where `second` overtakes `first`, found by bisection on the size.

    Args:
      first: a built reducer.
      second: the built reducer that may overtake it.
      topology: the machine, as for `predict_rows`.
      towers: the towers' devices, as for `predict_rows`.
      destinations: where the mean goes, as for `predict_rows`.
      low: the smallest size in bytes to search.
      high: the largest size in bytes to search.
      precision: how close (relative) the answer is.

    Returns:
      The size in bytes from which `second` is predicted faster than
      `first`, or None when the order does not change between `low` and
      `high`.
    """
    def second_wins(nbytes):
        return (predict_seconds(second, topology, towers, destinations, nbytes)
                < predict_seconds(first, topology, towers, destinations, nbytes))

    if second_wins(low) or not second_wins(high):
        return None
    while high > low * (1 + precision):
        middle = int((low * high) ** 0.5)
        if second_wins(middle):
            high = middle
        else:
            low = middle
    return high
