"""Gradient reducers: the built-ins, user functions, packing and compression.

See base.py for the contract, stateful.py for reducers with state, and
primitives.py for the collectives to write them with. `build(options,
placement)` turns the CLI's choice into one reducer callable; a stateful one
is built for its gradients by the step (`build_state`).
"""

from __future__ import annotations

import importlib

from engine.reducers.options import BUILT_INS, ReducerError, ReducerOptions, parameters

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

# What imports TensorFlow is loaded on first use: ReducerOptions checks a
# reducer's name before a run starts, TensorFlow with it.
_LAZY = {
    "STATEFUL": "engine.reducers.registry",
    "build": "engine.reducers.registry",
    "Reducer": "engine.reducers.base",
    "ReducerContext": "engine.reducers.stateful",
    "StatefulReducer": "engine.reducers.stateful",
    "build_state": "engine.reducers.stateful",
    "stateful_part": "engine.reducers.stateful",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine.reducers' has no attribute {name!r}")
