"""auto: for each gradient, the built-in the cost model predicts fastest.

Before the first step (`build`), each gradient's schedule under every
candidate (central, ring, tree, hierarchical) is traced for this placement
and priced on the topology (engine/cost): a file the user gives, or one
fitted on these devices at start-up. Each gradient (each packed buffer, with
`pack_bytes`) then goes to its choice. What the choices are, per size range,
is in the run's header and in the placement log's run record; the bytes a
step sends are the sum of each choice's traffic figure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf

from engine.cost import compare
from engine.cost.topology import Topology
from engine.reducers.stateful import ReducerContext, find_inner

CANDIDATES = ("central", "ring", "tree", "hierarchical")


def size_text(nbytes: int) -> str:
    """`512 B`, `4 KB`, `1.5 MB` (powers of 1024)."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            whole = value >= 10 or value == int(value)
            return f"{value:.0f} {unit}" if whole else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def auto_part(reducer) -> Auto | None:
    """The Auto in `reducer`, through wrappers (`inner`), or None."""
    return find_inner(reducer, Auto)


class Auto:
    """A reducer that hands each gradient to the candidate predicted fastest.

    Args:
      candidates: name -> built reducer, for this placement.
      topology: the costs, or a function of the devices that fits them
        (called once, at the first `build` or call that needs them).
    """

    def __init__(self, candidates: Mapping[str, Callable],
                 topology: Topology | Callable[[Sequence[str]], Topology]):
        self.candidates = dict(candidates)
        self._topology = topology
        self.context: ReducerContext | None = None
        self.plan: tuple[str, ...] = ()  # the choice per gradient of the built context
        self._predictions: dict[tuple, dict[str, float]] = {}

    def topology(self, devices: Sequence[str]) -> Topology:
        if not isinstance(self._topology, Topology):
            self._topology = self._topology(list(devices))
        return self._topology

    def predictions(self, elements: int, dtype: tf.DType, devices: Sequence[str],
                    destinations: Sequence[str]) -> dict[str, float]:
        """Predicted seconds of each candidate on one gradient of `elements`."""
        key = (elements, dtype.name, tuple(devices), tuple(destinations))
        if key not in self._predictions:
            topology = self.topology(sorted(set(devices) | set(destinations)))
            with tf.init_scope():  # trace apart from any function being traced
                self._predictions[key] = {
                    name: compare.predict_seconds(reducer, topology, devices, destinations,
                                                  elements * dtype.size, dtype)
                    for name, reducer in self.candidates.items()
                }
        return self._predictions[key]

    def choose(self, elements: int, dtype: tf.DType, devices: Sequence[str],
               destinations: Sequence[str]) -> str:
        """The candidate predicted fastest for one gradient of `elements`."""
        predicted = self.predictions(elements, dtype, devices, destinations)
        return min(predicted, key=predicted.get)

    def build(self, context: ReducerContext) -> None:
        """Chooses for each gradient of `context`."""
        self.context = context
        self.plan = tuple(
            self.choose(shape.num_elements(), dtype, context.devices, context.destinations)
            for shape, dtype in zip(context.shapes, context.dtypes)
        )

    def ranges(self) -> list[tuple[int, int, str]]:
        """(smallest bytes, largest bytes, choice) over the built gradients,
        in runs of one choice by size."""
        context = self.context
        if context is None:
            return []
        sized = sorted((s.num_elements() * d.size, name)
                       for s, d, name in zip(context.shapes, context.dtypes, self.plan))
        out: list[tuple[int, int, str]] = []
        for nbytes, name in sized:
            if out and out[-1][2] == name:
                out[-1] = (out[-1][0], nbytes, name)
            else:
                out.append((nbytes, nbytes, name))
        return out

    def describe(self) -> str:
        """`central for 40 B to 5 KB, ring for 401 KB (topology NAME)`."""
        def span(low, high):
            return size_text(low) if low == high else f"{size_text(low)} to {size_text(high)}"
        choices = ", ".join(f"{name} for {span(lo, hi)}" for lo, hi, name in self.ranges())
        name = self._topology.name if isinstance(self._topology, Topology) else "not fitted"
        return f"{choices} (predicted on topology {name!r})"

    def step_bytes(self) -> int | None:
        """Bytes a step of the built context sends: each choice's figure for
        its gradients, None when a choice has none."""
        if self.context is None:
            return None
        total = 0
        devices, destinations = list(self.context.devices), list(self.context.destinations)
        for nbytes, name in zip(self.context.nbytes, self.plan):
            figure = getattr(self.candidates[name], "traffic", None)
            sent = figure(devices, destinations, nbytes) if callable(figure) else None
            if sent is None:
                return None
            total += sum(sent.values())
        return total

    def _choices(self, grads, devices, destinations) -> list[str]:
        if len(self.plan) == len(grads):
            return list(self.plan)
        return [self.choose(g.shape.num_elements(), g.dtype, devices, destinations)
                for g in grads]

    def __call__(self, tower_grads, devices, destinations):
        names = self._choices(tower_grads[0], devices, destinations)
        out = [[None] * len(names) for _ in destinations]
        for name in dict.fromkeys(names):
            chosen = [v for v, n in enumerate(names) if n == name]
            reduced = self.candidates[name](
                [[grads[v] for v in chosen] for grads in tower_grads], devices, destinations)
            for d, results in enumerate(reduced):
                for v, result in zip(chosen, results):
                    out[d][v] = result
        return out

    def traffic(self, devices: Sequence[str], destinations: Sequence[str],
                nbytes: int) -> dict[str, int] | None:
        """The traffic of the candidate chosen for one float32 gradient of `nbytes`."""
        name = self.choose(nbytes // 4, tf.float32, devices, destinations)
        figure = getattr(self.candidates[name], "traffic", None)
        return figure(devices, destinations, nbytes) if callable(figure) else None
