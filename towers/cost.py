"""Predict before you measure: link and device costs, and a model of a reducer's schedule.

    import towers

    dgx1 = towers.cost.load("dgx1-v100")
    rows = towers.cost.compare(dgx1, sizes=[64 << 10, 16 << 20])
    for row in rows:
        print(row.reducer, row.tensor_bytes, row.seconds, row.busbw)

* `fit(devices)` measures this machine's devices and links (alpha, beta,
  gamma, shared cores) into a `Topology`; `dump` writes it as a file.
* `load(path_or_name)` reads a topology file or a built-in one
  (`builtin_topologies()`: DGX-1, PCIe boxes, NVSwitch, two hosts).
* `compare` predicts every reducer (a built-in's name, your function or a
  `package.module:function`) on every size; `crossover` finds the size at
  which one overtakes another; `predict` prices any `Schedule`
  (`trace_reduction` reads one off a reducer without running it).

Trainer(reducer="auto") chooses per gradient by the same model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.cost.compare import (
    Row,
    bus_factor,
    crossover,
    default_reduce_device,
    fastest,
    towers_of,
)
from engine.cost.compare import predict_rows as _predict_rows
from engine.cost.fit import QUICK, Fit, FitOptions, fit
from engine.cost.model import Prediction, predict
from engine.cost.schedule import Schedule, Task, trace_reduction
from engine.cost.topology import Topology, TopologyError, dump, load
from engine.cost.topology import builtin_names as builtin_topologies

__all__ = [
    "MODELLED",
    "QUICK",
    "Fit",
    "FitOptions",
    "Prediction",
    "Row",
    "Schedule",
    "Task",
    "Topology",
    "TopologyError",
    "builtin_topologies",
    "bus_factor",
    "compare",
    "crossover",
    "dump",
    "fastest",
    "fit",
    "load",
    "predict",
    "reducers_for",
    "towers_of",
    "trace_reduction",
]

MODELLED = ("central", "ring", "tree", "hierarchical")
"""The reducers the cost model predicts: a schedule of hops is written for each."""


def reducers_for(names: Sequence[str | Callable], towers: Sequence[str], reduce_device: str,
                 group_size: int = 2) -> dict[str, Callable]:
    """Built reducers for `towers`, by name.

    Args:
      names: built-ins the model can price (MODELLED: the ones that move
        tensors hop by hop), `package.module:function` specs, or functions
        of (tower_grads, devices, destinations).
      towers: the towers' devices.
      reduce_device: central's device.
      group_size: hierarchical's groups.

    Returns:
      name (a function's label) -> reducer.

    Raises:
      ReducerError: a name that is no reducer, or a built-in whose hops the
        model cannot see (collective and nccl are one op each; the ones with
        state need their state built on real devices).
    """
    from engine import reducers
    from engine.reducers.base import ReducerError
    from engine.topology.devices import Placement, Tower

    placement = Placement(tuple(Tower(i, d, len(towers)) for i, d in enumerate(towers)),
                          reduce_device)
    built = {}
    for name in names:
        options = reducers.ReducerOptions(name=name, group_size=group_size)
        if options.builtin is not None and options.builtin not in MODELLED:
            raise ReducerError(
                f"<reducers> {options.builtin!r} cannot be predicted: the model prices "
                f"{', '.join(MODELLED)} and your own functions (collective and nccl are "
                "one op each; reducers with state need real devices)"
            )
        built[options.label] = reducers.build(options, placement)
    return built


def compare(topology: Topology, reducers: Sequence[str | Callable] = MODELLED,
            sizes: Sequence[int] = (64 << 10, 1 << 20, 16 << 20), *,
            towers: Sequence[str] | None = None, reduce_device: str | None = None,
            variables: str = "replicated", group_size: int = 2) -> list[Row]:
    """Predicted time, algbw and busbw of each reducer on each size.

    Args:
      topology: the machine (`load`, `fit`).
      reducers: see `reducers_for`.
      sizes: bytes of float32 per tower.
      towers: default: the topology's GPUs, or all its devices.
      reduce_device: default: its first CPU device, else the first tower.
      variables: `replicated` (every tower needs the mean: an all-reduce) or
        `reduce-device` (only the reduce device does).
      group_size: hierarchical's groups.

    Returns:
      One Row per reducer and size, reducers in the order given.

    Raises:
      TopologyError: a tower the topology lacks.
      ReducerError: see `reducers_for`.
      ValueError: `variables` is neither mode.
    """
    if variables not in ("replicated", "reduce-device"):
        raise ValueError(f"variables {variables!r} is not replicated or reduce-device")
    towers = list(towers or towers_of(topology))
    reduce_device = reduce_device or default_reduce_device(topology, towers)
    destinations = towers if variables == "replicated" else [reduce_device]
    built = reducers_for(reducers, towers, reduce_device, group_size)
    return _predict_rows(built, topology, towers, destinations, sizes)
