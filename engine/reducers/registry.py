"""`build`: from ReducerOptions to the reducer a step calls, and what makes
each built-in (the functions TABLE in engine.reducers.options names).

Every reducer a run gets is one `build` made: the built-in or the user's
own, with compression and packing around it, and `Checked` outermost, which
checks the towers' gradients once before any of them sees them. Each
reducer opens its own name scopes (packing packs on the towers, outside the
reduction's scope; the sums are inside it): the placement log reads them.
"""

from __future__ import annotations

import dataclasses
import functools

from engine.reducers.auto import CANDIDATES, Auto
from engine.reducers.base import Link, Reducer, check_towers
from engine.reducers.cast import Cast
from engine.reducers.central import Central
from engine.reducers.collective import Collective
from engine.reducers.flat import FlatReducer
from engine.reducers.hierarchical import hierarchical_all_reduce
from engine.reducers.nccl import Nccl
from engine.reducers.options import STATEFUL_NAMES, TABLE, ReducerOptions, factory
from engine.reducers.packing import Packed
from engine.reducers.ring import ring_all_reduce, ring_traffic
from engine.reducers.stateful import ReducerContext, build_state
from engine.reducers.tree import halving_doubling, halving_doubling_traffic
from engine.topology.devices import Placement

__all__ = ["STATEFUL", "Checked", "build"]

# The research baselines with state, by name (engine.reducers.options.TABLE).
STATEFUL = {name: factory(name) for name in STATEFUL_NAMES}


def central(options: ReducerOptions, placement: Placement, link: Link) -> Reducer:
    return Central(placement.reduce_device, link)


def ring(options: ReducerOptions, placement: Placement, link: Link) -> Reducer:
    return FlatReducer(functools.partial(ring_all_reduce, link=link), link, ring_traffic)


def tree(options: ReducerOptions, placement: Placement, link: Link) -> Reducer:
    return FlatReducer(functools.partial(halving_doubling, link=link), link,
                       halving_doubling_traffic)


def hierarchical(options: ReducerOptions, placement: Placement, link: Link) -> Reducer:
    return FlatReducer(functools.partial(hierarchical_all_reduce, link=link,
                                         group_size=options.group_size), link)


def collective(options: ReducerOptions, placement: Placement, link: Link) -> Reducer:
    return Collective(placement.devices)


def nccl(options: ReducerOptions, placement: Placement, link: Link) -> Reducer:
    return Nccl(placement)


def auto(options: ReducerOptions, placement: Placement, link: Link) -> Reducer:
    """Each gradient to the candidate predicted fastest, on `options.topology`."""
    candidates = {name: _make(dataclasses.replace(options, name=name, pack_bytes=0,
                                                  topology=None), placement)
                  for name in CANDIDATES}
    return Auto(candidates, _topology(options.topology))


def _topology(given):
    """auto's costs: `given` (a Topology, or a file or built-in to load), else
    a function that fits them on the devices it is given."""
    from engine.cost import fit, topology

    if isinstance(given, topology.Topology):
        return given
    if given is not None:
        return topology.load(str(given))
    return lambda devices: fit.fit(devices, fit.QUICK, name="fitted at start-up").topology


@dataclasses.dataclass(frozen=True)
class Checked:
    """The reducer as a step calls it: the towers' gradients checked once
    (one list per device, aligned, none missing) before `inner` sees them.
    Everything else is its inner reducer's: the bytes it declares
    (`traffic`), auto's predictions, a stateful reducer's figures."""

    inner: Reducer

    def build(self, context: ReducerContext) -> None:
        build_state(self.inner, context)

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, tower_grads, devices, destinations):
        check_towers(tower_grads, devices)
        return self.inner(tower_grads, devices, destinations)


def _make(options: ReducerOptions, placement: Placement) -> Reducer:
    """The reducer of `options` with its compression and packing, unchecked."""
    entry = TABLE.get(options.builtin)
    if entry is None:
        reducer = options.function
    elif entry.stateful:
        reducer = factory(options.builtin)(**options.arguments)
    else:
        link = Link(options.compress if entry.compresses else None)
        reducer = factory(options.builtin)(options, placement, link)
    if options.compress and not (entry is not None and entry.compresses):
        reducer = Cast(reducer, options.compress)
    if options.pack_bytes:
        reducer = Packed(reducer, options.pack_bytes)
    return reducer


def build(options: ReducerOptions, placement: Placement) -> Reducer:
    """The reducer for `options`, checked against the placement.

    central, ring, tree and the four with state declare the bytes they move
    (a `traffic` method, engine/reducers/conformance.py); the others have no
    figure. A reducer with state is built for its gradients later
    (`build_state`).
    """
    return Checked(_make(options, placement))
