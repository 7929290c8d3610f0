"""How gradients are averaged, as the user says it: `ReducerOptions`.

A frozen, keyword-only dataclass whose `__post_init__` holds every rule about
the reducer's arguments. Nothing here imports TensorFlow until a reducer with
state is named (its parameters are its class's), so a bad name is refused
before a run starts.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable

from engine.errors import UsageError
from engine.userfn import check_signature, label, load_function, spec_arguments

__all__ = ["BUILT_INS", "BuiltIn", "COMPRESSION_DTYPES", "ReducerError", "ReducerOptions",
           "STATEFUL_NAMES", "TABLE", "factory", "parameters", "stateful_class"]


class ReducerError(UsageError):
    """A reducer that cannot serve this placement; the message is one line."""


@dataclasses.dataclass(frozen=True)
class BuiltIn:
    """A built-in reducer: what makes it, and what it accepts.

    Attributes:
      factory: `module:name` of what makes it (imported when it is built):
        a function of (options, placement, link), or, for one with state,
        its StatefulReducer class, made with the spec's parameters (its
        constructor's keyword arguments, `name:key=value,...`).
      stateful: keeps state between steps (engine.reducers.stateful); it
        compresses the gradients itself, so `compress` is refused.
      compresses: moves the gradients itself, narrowed per transfer with
        `compress` (through the Link it is made with); any other is wrapped
        in a cast (engine.reducers.cast).
      unpacked: why packing cannot serve it, or empty where it can.
    """

    factory: str
    stateful: bool = False
    compresses: bool = False
    unpacked: str = ""


# Every built-in by name: the one table the options check and the builder
# (engine.reducers.registry) read.
_MADE = "engine.reducers.registry"
TABLE = {
    "central": BuiltIn(f"{_MADE}:central", compresses=True),
    "ring": BuiltIn(f"{_MADE}:ring", compresses=True),
    "tree": BuiltIn(f"{_MADE}:tree", compresses=True),
    "hierarchical": BuiltIn(f"{_MADE}:hierarchical", compresses=True),
    "collective": BuiltIn(f"{_MADE}:collective"),
    "nccl": BuiltIn(f"{_MADE}:nccl"),
    "topk": BuiltIn("engine.reducers.topk:TopK", stateful=True),
    "powersgd": BuiltIn("engine.reducers.powersgd:PowerSGD", stateful=True,
                        unpacked="PowerSGD factors each gradient's own matrix, which "
                                 "packing flattens"),
    "signsgd": BuiltIn("engine.reducers.signsgd:SignSGD", stateful=True),
    "localsgd": BuiltIn("engine.reducers.localsgd:LocalSGD", stateful=True,
                        unpacked="local SGD sends no gradients to pack"),
    # Its candidates, hop-by-hop built-ins, narrow their own transfers.
    "auto": BuiltIn(f"{_MADE}:auto", compresses=True),
}
STATEFUL_NAMES = tuple(name for name, b in TABLE.items() if b.stateful)
BUILT_INS = tuple(TABLE)
"""Every reducer name `reducer=` takes, stateful ones and `auto` included."""
# The dtypes `compress` moves gradients in.
COMPRESSION_DTYPES = ("fp16", "bf16")
REDUCER_CONTRACT = (
    "a reducer takes (tower_grads, devices, destinations) and returns the mean for "
    "each destination"
)
def factory(name: str):
    """What makes the built-in `name` (imports it): TABLE's `factory`."""
    module, _, attribute = TABLE[name].factory.partition(":")
    return getattr(importlib.import_module(module), attribute)


def stateful_class(name: str):
    """The class of the built-in reducer with state called `name` (imports it)."""
    return factory(name)


def parameters(name: str) -> dict[str, object]:
    """The parameters a built-in takes in its spec (`topk:ratio=0.05`).

    Args:
      name: a built-in's name, one of BUILT_INS.

    Returns:
      Each parameter's name and default, in order: {"ratio": 0.01} for
      `topk`; {} for a built-in without parameters.
    """
    if name not in STATEFUL_NAMES:
        return {}
    signature = inspect.signature(stateful_class(name))
    return {p.name: p.default for p in signature.parameters.values()}


def _parse(spec: str) -> tuple[str, dict]:
    """(`topk`, {"ratio": 0.05}) of `topk:ratio=0.05`, checked against the
    built-in's parameters; ReducerError naming a bad key or value."""
    name = spec.partition(":")[0]
    return name, spec_arguments(spec, parameters(name), ReducerError, "reducer")


@dataclasses.dataclass(frozen=True, kw_only=True)
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
    # How messages and studies name it, where its own label is shared (two
    # objects of one class); empty: its own label.
    display: str = ""
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
            if builtin in STATEFUL_NAMES:  # checks the values: ranges are the class's
                stateful_class(builtin)(**arguments)
        elif isinstance(self.name, str) and ":" in self.name:
            object.__setattr__(self, "function", load_function(self.name, "reducer",
                                                               ReducerError))
        elif callable(self.name):
            object.__setattr__(self, "function", self.name)
        if inspect.isclass(self.function) and _is_stateful_class(self.function):
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
        if self.compress is not None and self.compress not in COMPRESSION_DTYPES:
            raise ReducerError(
                f"<compress> {self.compress!r} is not one of {', '.join(COMPRESSION_DTYPES)}"
            )
        if self.method in STATEFUL_NAMES and self.compress:
            raise ReducerError(
                f"<reducer={self.label}> <compress={self.compress}>: {self.method} "
                "compresses the gradients itself; leave out <compress>"
            )
        if self.method in TABLE and TABLE[self.method].unpacked and self.pack_bytes:
            raise ReducerError(
                f"<reducer={self.label}> <pack_bytes={self.pack_bytes}>: "
                f"{TABLE[self.method].unpacked}; leave out <pack_bytes>"
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
        if self.function is None or not _is_stateful_class(type(self.function)):
            return None
        return next((n for n in STATEFUL_NAMES
                     if isinstance(self.function, stateful_class(n))), None)

    @property
    def label(self) -> str:
        """How messages name the reducer: its name, spec or function's label
        (or `display`, where that is given)."""
        return self.display or label(self.name)


def _is_stateful_class(cls) -> bool:
    """True for a subclass of engine.reducers.stateful.StatefulReducer."""
    from engine.reducers.stateful import StatefulReducer

    return issubclass(cls, StatefulReducer)
