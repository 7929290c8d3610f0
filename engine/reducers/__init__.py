"""Gradient reducers: the built-ins, user functions, packing and compression.

See base.py for the contract, stateful.py for reducers with state, and
primitives.py for the collectives to write them with. `build(options,
placement)` turns the CLI's choice into one reducer callable; a stateful one
is built for its gradients by the step (`build_state`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable

from engine.reducers.auto import CANDIDATES, Auto
from engine.reducers.base import COMPRESSION, Link, Reducer, ReducerError
from engine.reducers.cast import Cast
from engine.reducers.central import Central
from engine.reducers.collective import Collective
from engine.reducers.flat import FlatReducer
from engine.reducers.hierarchical import hierarchical_all_reduce
from engine.reducers.localsgd import LocalSGD
from engine.reducers.nccl import Nccl
from engine.reducers.packing import Packed
from engine.reducers.powersgd import PowerSGD
from engine.reducers.ring import ring_all_reduce, ring_traffic
from engine.reducers.signsgd import SignSGD
from engine.reducers.stateful import (
    ReducerContext,
    StatefulReducer,
    build_state,
    stateful_part,
)
from engine.reducers.topk import TopK
from engine.reducers.tree import halving_doubling, halving_doubling_traffic
from engine.topology.devices import Placement
from engine.userfn import check_signature, label, load_function, spec_arguments

# The research baselines with state, by name; their parameters are their
# constructors' keyword arguments, given as `name:key=value,...`.
STATEFUL = {"topk": TopK, "powersgd": PowerSGD, "signsgd": SignSGD, "localsgd": LocalSGD}
BUILT_INS = ("central", "ring", "tree", "hierarchical", "collective", "nccl", *STATEFUL, "auto")
REDUCER_CONTRACT = (
    "a reducer takes (tower_grads, devices, destinations) and returns the mean for "
    "each destination"
)
# Built-ins that move tensors themselves, hop by hop, through a Link.
_HOP_BY_HOP = ("central", "ring", "tree", "hierarchical")
# Built-ins that cannot work on packed buffers, and why.
_NOT_PACKED = {
    "powersgd": "PowerSGD factors each gradient's own matrix, which packing flattens",
    "localsgd": "local SGD sends no gradients to pack",
}

__all__ = [
    "BUILT_INS",
    "STATEFUL",
    "Reducer",
    "ReducerContext",
    "ReducerError",
    "ReducerOptions",
    "StatefulReducer",
    "build",
    "build_state",
    "parameters",
    "stateful_part",
]


def parameters(name: str) -> dict[str, object]:
    """The parameters a built-in takes in its spec (`topk:ratio=0.05`).

    Args:
      name: a built-in's name, one of BUILT_INS.

    Returns:
      Each parameter's name and default, in order: {"ratio": 0.01} for
      `topk`; {} for a built-in without parameters.
    """
    cls = STATEFUL.get(name)
    if cls is None:
        return {}
    return {p.name: p.default for p in inspect.signature(cls).parameters.values()}


def _parse(spec: str) -> tuple[str, dict]:
    """(`topk`, {"ratio": 0.05}) of `topk:ratio=0.05`, checked against the
    built-in's parameters; ReducerError naming a bad key or value."""
    name = spec.partition(":")[0]
    return name, spec_arguments(spec, parameters(name), ReducerError, "reducer")


@dataclasses.dataclass(frozen=True)
class ReducerOptions:
    """How gradients are averaged.

    Attributes:
      name: a built-in (BUILT_INS), with its parameters for those with state
        (`topk:ratio=0.05`); `package.module:function` or `:Class` (a
        StatefulReducer); a function of (tower_grads, devices, destinations)
        (base.py has the contract); or a StatefulReducer object.
      group_size: towers per group for `hierarchical`.
      pack_bytes: fuse gradients into buffers of about this many bytes before
        reducing; 0 reduces each gradient alone.
      compress: `fp16` or `bf16` to move gradients in that dtype, or None.
      topology: for `auto`, the costs its choices are predicted on: a
        topology file's path, a built-in's name (engine/cost/topologies), or
        an engine.cost.Topology; None fits them on the run's devices at
        start-up (a few seconds).
    """

    name: str | Callable = "central"
    group_size: int = 2
    pack_bytes: int = 0
    compress: str | None = None
    topology: object = None
    # The user's function, loaded from `name`; None for a built-in.
    function: Callable | None = dataclasses.field(default=None, init=False, repr=False,
                                                  compare=False)
    # The built-in `name` names (its part before `:`), and its parameters.
    builtin: str | None = dataclasses.field(default=None, init=False, compare=False)
    arguments: dict = dataclasses.field(default_factory=dict, init=False, compare=False)

    def __post_init__(self):
        base = self.name.partition(":")[0] if isinstance(self.name, str) else None
        if base in BUILT_INS:
            builtin, arguments = _parse(self.name)
            object.__setattr__(self, "builtin", builtin)
            object.__setattr__(self, "arguments", arguments)
            if builtin in STATEFUL:  # checks the values: ranges are the class's
                STATEFUL[builtin](**arguments)
        elif isinstance(self.name, str) and ":" in self.name:
            object.__setattr__(self, "function", load_function(self.name, "reducer",
                                                               ReducerError))
        elif callable(self.name):
            object.__setattr__(self, "function", self.name)
        if inspect.isclass(self.function) and issubclass(self.function, StatefulReducer):
            object.__setattr__(self, "function", self.function())
        if self.function is None and self.builtin is None:
            raise ReducerError(
                f"<reducer> {self.name!r} is not one of {', '.join(BUILT_INS)} "
                "and not package.module:function"
            )
        if self.function is not None:
            check_signature(self.function, "reducer", REDUCER_CONTRACT, [], [], [])
        if self.group_size < 1:
            raise ReducerError(f"<group_size> ({self.group_size}) must be at least 1")
        if self.pack_bytes < 0:
            raise ReducerError(f"<pack_bytes> ({self.pack_bytes}) must be 0 or more")
        if self.compress is not None and self.compress not in COMPRESSION:
            raise ReducerError(
                f"<compress> {self.compress!r} is not one of {', '.join(COMPRESSION)}"
            )
        if self.method in STATEFUL and self.compress:
            raise ReducerError(
                f"<reducer={self.label}> <compress={self.compress}>: {self.method} "
                "compresses the gradients itself; leave out <compress>"
            )
        if self.method in _NOT_PACKED and self.pack_bytes:
            raise ReducerError(
                f"<reducer={self.label}> <pack_bytes={self.pack_bytes}>: "
                f"{_NOT_PACKED[self.method]}; leave out <pack_bytes>"
            )
        if self.topology is not None and self.method != "auto":
            raise ReducerError(
                f"<topology> is for <reducer=auto>, which chooses by it; "
                f"<reducer={self.label}> does not use one"
            )
        if self.builtin == "nccl" and self.compress == "bf16":
            raise ReducerError(
                "<reducer=nccl> <compress=bf16>: NCCL's all-reduce in TensorFlow "
                "takes half, float, double, int32 or int64; use <compress=fp16>"
            )

    @property
    def method(self) -> str | None:
        """The built-in this is, by name or by class (`TopK()` is `topk`)."""
        if self.builtin is not None:
            return self.builtin
        return next((n for n, cls in STATEFUL.items() if isinstance(self.function, cls)), None)

    @property
    def label(self) -> str:
        """How messages name the reducer: its name, spec or function's label."""
        return label(self.name)


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
