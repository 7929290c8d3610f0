"""Reducers with state: built once for the run, state in tf.Variables.

Error-feedback compression keeps each tower's residual between steps, PowerSGD
its warm-started factors, local SGD a step count. Such a reducer subclasses
`StatefulReducer` (a `tf.Module`):

    class MyReducer(StatefulReducer):
        def build(self, context):            # once, before the first step
            self.residuals = [[tf.Variable(tf.zeros(shape, dtype)) ...]]
        def __call__(self, tower_grads, devices, destinations):
            ...                              # the contract of base.py

`build` gets a `ReducerContext`: the gradients' shapes and dtypes, the
devices, the destinations, the variable mode, the global step, and with
replicated variables each replica's variables. It creates the state as
tf.Variables under `tf.device` of the device that uses them (a tower's
residual on that tower) and keeps them as attributes: the engine saves the
module in every checkpoint, so the state is restored exactly on resume.
`build` may be called again (the conformance kit and `check_reducer` build a
reducer for their own calls first); each call starts from fresh state.

Two optional hooks:
* `after_update()`: ops to run after the optimizer's update of every step
  (local SGD averages the replicas there);
* `residuals`: tower k's pending error, [k][v], for reducers with error
  feedback; the conformance kit checks that what was sent plus what is
  pending equals what was given.
and two figures: `lossy` (the result is the mean only over many steps) and
`traffic(devices, destinations, nbytes)` (conformance.py): the built-ins give
it for the context they were built for; the run passes the gradients' bytes.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

__all__ = ["ReducerContext", "StatefulReducer", "build_state", "stateful_part"]


@dataclasses.dataclass(frozen=True, eq=False)  # holds variables: compared by identity
class ReducerContext:
    """What a stateful reducer is built for.

    Attributes:
      shapes: each gradient's shape, in the order of the calls' lists.
      dtypes: each gradient's dtype.
      devices: the towers' devices, by tower index.
      destinations: the devices that get the mean (the variable mode's).
      variables: `replicated` or `reduce-device`.
      step: an int64 scalar variable holding the steps taken before the
        current one (read it for warm-up schedules), or None.
      replicas: with replicated variables, replicas[k] lists tower k's
        floating-point model variables and optimizer slots, aligned across
        towers (local SGD averages them); empty otherwise.
    """

    shapes: tuple[tf.TensorShape, ...]
    dtypes: tuple[tf.DType, ...]
    devices: tuple[str, ...]
    destinations: tuple[str, ...]
    variables: str = "replicated"
    step: tf.Variable | None = None
    replicas: tuple[tuple[tf.Variable, ...], ...] = ()

    def __post_init__(self):
        # Keras variables give their dtype as a string and their shape as a tuple.
        object.__setattr__(self, "shapes", tuple(tf.TensorShape(s) for s in self.shapes))
        object.__setattr__(self, "dtypes", tuple(tf.as_dtype(d) for d in self.dtypes))

    @property
    def nbytes(self) -> list[int]:
        """Bytes of each gradient."""
        return [s.num_elements() * d.size for s, d in zip(self.shapes, self.dtypes)]

    def replace(self, **changes: object) -> ReducerContext:
        """A copy with `changes` (field -> value), as `dataclasses.replace`.

        Args:
          **changes: the fields to change and their new values.
        """
        return dataclasses.replace(self, **changes)


class StatefulReducer(tf.Module):
    """A reducer that is built once and keeps tf.Variables between calls.

    Subclasses define `build(context)` and `__call__(tower_grads, devices,
    destinations)` (module docstring). Set `lossy = True` when one call
    returns only an approximation of the mean (compression); its error
    feedback is then checked over several steps instead.

    Args:
      name: the tf.Module's name (its variables' name scope).
    """

    lossy = False

    def __init__(self, name: str | None = None):
        super().__init__(name=name)
        self.context: ReducerContext | None = None

    def build(self, context: ReducerContext) -> None:
        """Creates the state for `context`; may be called again to start afresh.

        Args:
          context: the towers, the gradients' shapes and the variables.
        """
        raise NotImplementedError(f"{type(self).__name__}.build(context) is not defined")

    def __call__(self, tower_grads, devices, destinations):
        raise NotImplementedError(f"{type(self).__name__}.__call__ is not defined")

    def after_update(self) -> None:
        """Ops to run after each step's update; none by default."""

    def step_bytes(self) -> int | None:
        """Bytes a train step of the built context sends for this reducer, all
        devices together: by default the call's `traffic`."""
        traffic = getattr(self, "traffic", None)
        if self.context is None or not callable(traffic):
            return None
        figure = traffic(list(self.context.devices), list(self.context.destinations),
                         sum(self.context.nbytes))
        return None if figure is None else sum(figure.values())


def find_inner(reducer, kind: type):
    """The first reducer of class `kind` in `reducer` or the reducers it wraps
    (`inner`, as packing, compression and build's check do), or None."""
    while reducer is not None and not isinstance(reducer, kind):
        reducer = getattr(reducer, "inner", None)
    return reducer


def stateful_part(reducer) -> StatefulReducer | None:
    """The StatefulReducer in `reducer`, through wrappers (`inner`), or None."""
    return find_inner(reducer, StatefulReducer)


def build_state(reducer, context: ReducerContext) -> None:
    """Builds `reducer` for `context` if it has state; wrappers pass on the
    context their inner reducer sees (packing: buffers, compression: dtypes)."""
    build = getattr(reducer, "build", None)
    if callable(build):
        build(context)

