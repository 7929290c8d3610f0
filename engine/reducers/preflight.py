"""`check_reducer`: a reducer against the exact mean, on gradients of the
model's own shapes and the run's own devices, before the first step.

A reducer that returns the sum trains, only with a learning rate N times too
large; this check stops such a run before any update, and says by how much the
result is off (the conformance kit's `mean_problem`). A stateful reducer that
compresses (`lossy`) is held to the error-feedback invariant over a few calls
instead (`feedback_problem`), if it keeps `residuals`; either way it is built
again afterwards, so the run starts from fresh state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from engine.reducers.base import COMPRESSION, ReducerError
from engine.reducers.conformance_checks import (
    FEEDBACK_STEPS,
    exact_means,
    feedback_problem,
    first,
    mean_problem,
    result_problems,
    run_call,
    structure_problem,
    tolerance,
)
from engine.reducers.stateful import ReducerContext, build_state, find_inner, stateful_part
from engine.userfn import calling

__all__ = ["check_on_model"]


def check_on_model(
    reducer, model, devices: Sequence[str], destinations: Sequence[str], name: str,
    compress: str | None = None, context: ReducerContext | None = None,
) -> None:
    """Reduces random gradients shaped as `model`'s trainable variables,
    one set per tower, and compares the result with their exact mean.

    Args:
      reducer: the run's reducer.
      model: the model whose variables give the shapes.
      devices: the towers' devices.
      destinations: where the variable mode wants the mean.
      name: how messages name the reducer.
      compress: the reducer's transfer dtype (`fp16`, `bf16`) or None, which
        loosens the tolerance to that dtype's.
      context: what a stateful reducer was built for; it is built for it
        again after the check.

    Raises:
      ReducerError: the result is not the mean; the message gives the factor.
      UserCodeError: the reducer raised.
    """
    rng = np.random.default_rng(0)
    shapes = [tuple(v.shape) for v in model.trainable_variables]

    def gradients():
        return [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in devices]

    arrays = gradients()
    state = stateful_part(reducer)
    allowed = tolerance(tf.float32, COMPRESSION.get(compress))
    try:
        with calling("reducer", name):
            symbolic, values, _ = run_call(reducer, arrays, devices, destinations, tf.float32)
            problem = structure_problem(symbolic, destinations, len(shapes))
            if problem is None:
                wrong_shapes, _, _ = result_problems(symbolic, values, destinations, arrays,
                                                     tf.float32, {})
                problem = first(wrong_shapes)
            if problem is None and state is not None and state.lossy:
                # Packed, its residuals are per buffer, not per gradient.
                if hasattr(state, "residuals") and not _packed(reducer):
                    steps = [arrays] + [gradients() for _ in range(FEEDBACK_STEPS - 1)]
                    problem = feedback_problem(reducer, steps, devices, destinations,
                                               tf.float32, allowed)
            elif problem is None:
                problem = mean_problem(
                    [[np.asarray(t) for t in per_destination] for per_destination in values],
                    exact_means(arrays, tf.float32), destinations, len(devices), allowed,
                )
    finally:
        if state is not None and context is not None:
            build_state(reducer, context)  # the run starts from fresh state
    if problem is not None:
        raise ReducerError(f"<check_reducer>: <reducer> {name!r} {problem}")


def _packed(reducer) -> bool:
    """Whether packing wraps the reducer (engine.reducers.packing)."""
    from engine.reducers.packing import Packed

    return find_inner(reducer, Packed) is not None
