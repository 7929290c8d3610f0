"""The built-in reducers by name, and `build`: from ReducerOptions to the
reducer a step calls, checked against the placement."""

from __future__ import annotations

import dataclasses
import functools

from engine.reducers.auto import CANDIDATES, Auto
from engine.reducers.base import Link, Reducer
from engine.reducers.cast import Cast
from engine.reducers.central import Central
from engine.reducers.collective import Collective
from engine.reducers.flat import FlatReducer
from engine.reducers.hierarchical import hierarchical_all_reduce
from engine.reducers.localsgd import LocalSGD
from engine.reducers.nccl import Nccl
from engine.reducers.options import (
    ReducerOptions,
)
from engine.reducers.packing import Packed
from engine.reducers.powersgd import PowerSGD
from engine.reducers.ring import ring_all_reduce, ring_traffic
from engine.reducers.signsgd import SignSGD
from engine.reducers.topk import TopK
from engine.reducers.tree import halving_doubling, halving_doubling_traffic
from engine.topology.devices import Placement

# The research baselines with state, by name (engine.reducers.options).
STATEFUL = {"topk": TopK, "powersgd": PowerSGD, "signsgd": SignSGD, "localsgd": LocalSGD}
# Built-ins that move tensors themselves, hop by hop, through a Link.
_HOP_BY_HOP = ("central", "ring", "tree", "hierarchical")



def _topology(given):
    """auto's costs: `given` (a Topology, or a file or built-in to load), else
    a function that fits them on the devices it is given."""
    from engine.cost import fit, topology

    if isinstance(given, topology.Topology):
        return given
    if given is not None:
        return topology.load(str(given))
    return lambda devices: fit.fit(devices, fit.QUICK, name="fitted at start-up").topology


def build(options: ReducerOptions, placement: Placement) -> Reducer:
    """The reducer for `options`, checked against the placement.

    central, ring, tree and the four with state declare the bytes they move
    (a `traffic` method, engine/reducers/conformance.py); the others have no
    figure. A reducer with state is built for its gradients later
    (`build_state`).
    """
    name = options.builtin
    link = Link(options.compress if name in _HOP_BY_HOP else None)
    devices = placement.devices
    if name == "central":
        reducer = Central(placement.reduce_device, link)
    elif name in STATEFUL:
        reducer = STATEFUL[name](**options.arguments)
    elif name == "ring":
        reducer = FlatReducer(functools.partial(ring_all_reduce, link=link), link, ring_traffic)
    elif name == "tree":
        reducer = FlatReducer(
            functools.partial(halving_doubling, link=link), link, halving_doubling_traffic
        )
    elif name == "hierarchical":
        all_reduce = functools.partial(
            hierarchical_all_reduce, link=link, group_size=options.group_size
        )
        reducer = FlatReducer(all_reduce, link)
    elif name == "collective":
        reducer = Collective(devices)
    elif name == "nccl":
        reducer = Nccl(placement)
    elif name == "auto":
        reducer = Auto(
            {n: build(dataclasses.replace(options, name=n, pack_bytes=0, topology=None),
                      placement) for n in CANDIDATES},
            _topology(options.topology),
        )
    else:
        reducer = options.function
    if options.compress and name not in (*_HOP_BY_HOP, "auto"):
        reducer = Cast(reducer, options.compress)
    if options.pack_bytes:
        reducer = Packed(reducer, options.pack_bytes)
    return reducer
