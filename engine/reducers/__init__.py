"""Gradient reducers: the built-ins, user functions, packing and compression.

See base.py for the contract. `build(options, placement)` turns the CLI's
choice into one reducer callable.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from engine.reducers.base import COMPRESSION, FlatReducer, Link, Reducer, ReducerError
from engine.reducers.cast import Cast
from engine.reducers.central import Central
from engine.reducers.collective import Collective
from engine.reducers.hierarchical import hierarchical_all_reduce
from engine.reducers.nccl import Nccl
from engine.reducers.packing import Packed
from engine.reducers.ring import ring_all_reduce, ring_traffic
from engine.reducers.tree import halving_doubling, halving_doubling_traffic
from engine.topology.devices import Placement
from engine.userfn import check_signature, label, load_function

BUILT_INS = ("central", "ring", "tree", "hierarchical", "collective", "nccl")
REDUCER_CONTRACT = (
    "a reducer takes (tower_grads, devices, destinations) and returns the mean for "
    "each destination"
)
# Built-ins that move tensors themselves, hop by hop, through a Link.
_HOP_BY_HOP = ("central", "ring", "tree", "hierarchical")

__all__ = ["BUILT_INS", "Reducer", "ReducerError", "ReducerOptions", "build"]


@dataclasses.dataclass(frozen=True)
class ReducerOptions:
    """How gradients are averaged.

    Attributes:
      name: a built-in (BUILT_INS), `package.module:function`, or a function
        of (tower_grads, devices, destinations) (base.py has the contract).
      group_size: towers per group for `hierarchical`.
      pack_bytes: fuse gradients into buffers of about this many bytes before
        reducing; 0 reduces each gradient alone.
      compress: `fp16` or `bf16` to move gradients in that dtype, or None.
    """

    name: str | Callable = "central"
    group_size: int = 2
    pack_bytes: int = 0
    compress: str | None = None
    # The user's function, loaded from `name`; None for a built-in.
    function: Callable | None = dataclasses.field(default=None, init=False, repr=False,
                                                  compare=False)

    def __post_init__(self):
        if isinstance(self.name, str) and ":" in self.name:
            object.__setattr__(self, "function", load_function(self.name, "reducer",
                                                               ReducerError))
        elif callable(self.name):
            object.__setattr__(self, "function", self.name)
        elif self.name not in BUILT_INS:
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
        if self.name == "nccl" and self.compress == "bf16":
            raise ReducerError(
                "<reducer=nccl> <compress=bf16>: NCCL's all-reduce in TensorFlow "
                "takes half, float, double, int32 or int64; use <compress=fp16>"
            )

    @property
    def label(self) -> str:
        """How messages name the reducer: its name, spec or function's label."""
        return label(self.name)


def build(options: ReducerOptions, placement: Placement) -> Reducer:
    """The reducer for `options`, checked against the placement.

    central, ring and tree declare the bytes they move (a `traffic` method,
    engine/reducers/conformance.py); the others have no figure.
    """
    link = Link(options.compress if options.name in _HOP_BY_HOP else None)
    devices = placement.devices
    if options.name == "central":
        reducer = Central(placement.reduce_device, link)
    elif options.name == "ring":
        reducer = FlatReducer(functools.partial(ring_all_reduce, link=link), link, ring_traffic)
    elif options.name == "tree":
        reducer = FlatReducer(
            functools.partial(halving_doubling, link=link), link, halving_doubling_traffic
        )
    elif options.name == "hierarchical":
        all_reduce = functools.partial(
            hierarchical_all_reduce, link=link, group_size=options.group_size
        )
        reducer = FlatReducer(all_reduce, link)
    elif options.name == "collective":
        reducer = Collective(devices)
    elif options.name == "nccl":
        reducer = Nccl(placement)
    else:
        reducer = options.function
    if options.compress and options.name not in _HOP_BY_HOP:
        reducer = Cast(reducer, options.compress)
    if options.pack_bytes:
        reducer = Packed(reducer, options.pack_bytes)
    return reducer
