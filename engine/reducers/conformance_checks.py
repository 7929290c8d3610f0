"""The conformance checks one by one: each returns what is wrong, or None.

conformance.py runs them on a reducer and reports; these functions make the
call they judge, and judge it. Each problem is one line that says what the
reducer did and what it should do instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from engine.reducers import measure
from engine.reducers.stateful import ReducerContext, build_state, stateful_part
from engine.topology.devices import canonical

# Absolute tolerance per dtype, scaled by the largest mean when it is above 1.
TOLERANCE = {tf.float64: 1e-12, tf.float32: 1e-5, tf.float16: 2e-2, tf.bfloat16: 5e-2}


def device_names(names: Sequence[str], argument: str) -> list[str]:
    """Canonical names of `names`; ValueError naming `argument` for one not here."""
    here = [canonical(d.name) for d in tf.config.list_logical_devices()]
    out = []
    for name in names:
        device = canonical(name)
        if device is None or device not in here:
            raise ValueError(
                f"{argument}: {name!r} is not a device here; devices here: "
                f"{', '.join(d for d in here if d)}"
            )
        out.append(device)
    return out


def build_for(reducer, shapes, devices: Sequence[str], destinations: Sequence[str],
              dtype: tf.DType) -> tf.Variable | None:
    """Builds a stateful `reducer` afresh for gradients of `shapes`, in `dtype`;
    returns the step variable it reads, None for a stateless one."""
    if stateful_part(reducer) is None:
        return None
    with tf.device(devices[0]):
        step = tf.Variable(0, dtype=tf.int64, trainable=False)
    build_state(reducer, ReducerContext(
        shapes=tuple(shapes),
        dtypes=tuple(dtype for _ in shapes),
        devices=tuple(devices), destinations=tuple(destinations),
        variables="replicated" if list(destinations) == list(devices) else "reduce-device",
        step=step,
    ))
    return step


def run_call(reducer, arrays, devices: Sequence[str], destinations: Sequence[str],
             dtype: tf.DType):
    """Calls `reducer` in a tf.function on arrays[k][v] placed on devices[k].

    Returns:
      (the traced outputs, the eager outputs, {argument op: its device}) for
      structure_problem, result_problems and mean_problem.
    """
    build_for(reducer, [np.shape(a) for a in arrays[0]], devices, destinations, dtype)
    inputs = _placed(arrays, devices, dtype)
    # Without autograph a reducer's own exception keeps its own message; a
    # reducer builds its ops in plain Python, so it needs no conversion.
    function = tf.function(
        lambda grads: reducer(grads, list(devices), list(destinations)), autograph=False
    )
    graph = function.get_concrete_function(inputs).graph
    argument_devices = [device for device, tower in zip(devices, arrays) for _ in tower]
    on_device = {t.op.name: d for t, d in zip(graph.inputs, argument_devices)}
    return graph.structured_outputs, function(inputs), on_device


def _placed(arrays, devices: Sequence[str], dtype: tf.DType) -> list[list[tf.Tensor]]:
    inputs = []
    for tower, device in zip(arrays, devices):
        with tf.device(device):
            inputs.append([tf.constant(a, dtype=dtype) for a in tower])
    return inputs


# Calls the feedback check makes: enough for a residual to be fed back and
# changed again.
FEEDBACK_STEPS = 4


def feedback_problem(reducer, steps_arrays, devices: Sequence[str],
                     destinations: Sequence[str], dtype: tf.DType,
                     tolerance_: float) -> str | None:
    """What an error-feedback reducer sent plus what it holds back is not what
    it was given? Over the calls on steps_arrays[s][k][v], on every destination,

        sum_s result_s[v] + mean_k residuals[k][v] = sum_s mean_k arrays[s][k][v]

    (each tower's part of the mean was sent, or is still in its residual).
    Builds the reducer afresh; its `residuals[k][v]` must have the gradients'
    shapes.
    """
    step = build_for(reducer, [np.shape(a) for a in steps_arrays[0][0]], devices,
                     destinations, dtype)
    state = stateful_part(reducer)
    function = tf.function(
        lambda grads: reducer(grads, list(devices), list(destinations)), autograph=False
    )
    totals = None
    for arrays in steps_arrays:
        values = function(_placed(arrays, devices, dtype))
        got = [[np.asarray(t, np.float64) for t in per_d] for per_d in values]
        totals = got if totals is None else [
            [a + b for a, b in zip(x, y)] for x, y in zip(totals, got)]
        step.assign_add(1)
    pending = [np.mean([np.asarray(r[v], np.float64) for r in state.residuals], axis=0)
               for v in range(len(steps_arrays[0][0]))]
    given = [sum(m) for m in zip(*(exact_means(a, dtype) for a in steps_arrays))]
    for destination, per_d in zip(destinations, totals):
        for v, (sent, held, want) in enumerate(zip(per_d, pending, given)):
            tol = tolerance_ * len(steps_arrays) * max(1.0, float(np.abs(want).max(initial=0)))
            error = float(np.abs(sent + held - want).max(initial=0))
            if not error <= tol:
                return (f"variable {v} for {destination}: what was sent over "
                        f"{len(steps_arrays)} calls plus the residuals is off the sum of "
                        f"the means by {error:.3g} (tolerance {tol:.3g}); keep in "
                        "residuals[k][v] exactly what tower k did not send")
    return None


def exact_mean_factor(results: Sequence, means: Sequence) -> float:
    """The factor k for which k x `means` comes closest to `results`.

    Args:
      results: a reducer's result arrays (NumPy arrays or eager tensors).
      means: the exact means, one per result, of the same shapes.

    Returns:
      The least-squares ratio: 1.0 for a reducer that returns the mean, N for
      one that returns the sum over N towers; nan when the means are all 0.

    Raises:
      ValueError: when `results` and `means` do not pair up.
    """
    if len(results) != len(means):
        raise ValueError(
            f"results ({len(results)} arrays) and means ({len(means)}) differ in "
            "length; pass one mean per result"
        )
    got, want = [np.zeros(0)], [np.zeros(0)]
    for k, (result, mean) in enumerate(zip(results, means)):
        result, mean = np.asarray(result, np.float64), np.asarray(mean, np.float64)
        if result.shape != mean.shape:
            raise ValueError(
                f"results[{k}] has shape {result.shape}, means[{k}] {mean.shape}; "
                "pass means of the results' shapes"
            )
        got.append(result.ravel())
        want.append(mean.ravel())
    got, want = np.concatenate(got), np.concatenate(want)
    norm = float(want @ want)
    return float(got @ want) / norm if norm else float("nan")


def one_line(err: BaseException) -> str:
    """`Type: first line of the message`, at most 300 characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def first(problems: list[str]) -> str | None:
    """The first problem, with how many more; None when there are none."""
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def structure_problem(outputs, destinations: Sequence[str], variables: int) -> str | None:
    """Not one list per destination, one tensor per variable?"""

    def count(x, what):
        return f"{len(x)} {what}" if isinstance(x, list | tuple) else f"a {type(x).__name__}"

    if not isinstance(outputs, list | tuple) or len(outputs) != len(destinations):
        return (f"returned {count(outputs, 'lists')} for {len(destinations)} "
                "destinations; return one list per destination")
    for destination, tensors in zip(destinations, outputs):
        if not isinstance(tensors, list | tuple) or len(tensors) != variables:
            return (f"returned {count(tensors, 'tensors')} for {destination}; "
                    f"return one per variable ({variables})")
        for v, tensor in enumerate(tensors):
            if not isinstance(tensor, tf.Tensor):
                return (f"variable {v} for {destination} is a {type(tensor).__name__}, "
                        "not a tensor")
    return None


def made_on(tensor: tf.Tensor, argument_devices: dict[str, str]) -> str | None:
    """The device of the op that made a tf.function's output `tensor`.

    `argument_devices` maps the function's argument ops to the devices of
    the tensors passed, for a result that is an argument passed through.
    """
    # tf.function hands each output back through an unplaced Identity, and
    # its eager outputs all come back to one device: read the traced graph.
    if tensor.op.type == "Identity" and not tensor.op.device:
        tensor = tensor.op.inputs[0]
    return argument_devices.get(tensor.op.name) or canonical(tensor.op.device or "")


def result_problems(symbolic, values, destinations: Sequence[str], arrays,
                    dtype: tf.DType, argument_devices: dict[str, str]):
    """Results not of their gradient's shape, or dtype, or not on their destination.

    Args:
      symbolic, values: the traced and the eager results, [d][v], of the
        right structure (structure_problem).
      destinations: the names of the d's.
      arrays: arrays[k][v], the gradients.
      dtype: the gradients' dtype.
      argument_devices: as for made_on.

    Returns:
      Three lists of problems: shapes, dtypes, placement.
    """
    shapes, dtypes, placement = [], [], []
    for destination, tensors, results in zip(destinations, symbolic, values):
        for v, (tensor, value) in enumerate(zip(tensors, results)):
            want = np.shape(arrays[0][v])
            if tuple(value.shape) != want:
                shapes.append(f"variable {v} for {destination} has shape "
                              f"{tuple(value.shape)}, its gradient {want}")
            if value.dtype != dtype:
                dtypes.append(f"variable {v} for {destination} is {value.dtype.name}, "
                              f"its gradient {dtype.name}; cast it back")
            device = made_on(tensor, argument_devices)
            if device != destination:
                where = f"on {device}" if device else "with no device"
                placement.append(f"variable {v} for {destination} was made {where}; "
                                 f"make it under tf.device({destination!r})")
    return shapes, dtypes, placement


def exact_means(arrays, dtype: tf.DType) -> list[np.ndarray]:
    """The mean over towers of arrays[k][v], per v, of the arrays as `dtype` holds them."""
    cast = [[tf.constant(a, dtype).numpy().astype(np.float64) for a in t] for t in arrays]
    return [np.mean([tower[v] for tower in cast], axis=0) for v in range(len(cast[0]))]


def mean_problem(values, expected, destinations: Sequence[str], towers: int,
                 tolerance: float) -> str | None:
    """Not the mean within `tolerance`? Names the factor it is off by.

    Args:
      values: values[d][v], the reducer's results, of the expected shapes.
      expected: expected[v], the exact mean of variable v (float64).
      destinations: the names of the d's.
      towers: how many towers were reduced.
      tolerance: the absolute error allowed, scaled by the largest mean when
        it is above 1 (see `tolerance`).
    """
    off = []
    for destination, tensors in zip(destinations, values):
        for v, (got, want) in enumerate(zip(tensors, expected)):
            tol = tolerance * max(1.0, float(np.abs(want).max(initial=0)))
            error = float(np.abs(np.asarray(got, np.float64) - want).max(initial=0))
            if not error <= tol:  # NaN too
                off.append((error, tol, destination, v))
    if not off:
        return None
    factor = exact_mean_factor(
        [g for tensors in values for g in tensors], [w for _ in values for w in expected]
    )
    if abs(factor - 1) > 0.01:
        said = f"returned {factor:.2f} x the mean"
        if towers > 1 and abs(factor - towers) <= 0.01 * towers:
            return f"{said} (the sum over {towers} towers?); divide by len(devices)"
        return f"{said}; return the mean over the {_towers(towers)}"
    error, tol, destination, v = max(off)
    return (f"variable {v} for {destination} is off the mean by {error:.3g} "
            f"(tolerance {tol:.3g}); return the mean over the {_towers(towers)}")


def _towers(n: int) -> str:
    return f"{n} tower{'s' if n > 1 else ''}"


def tolerance(dtype: tf.DType, compressed_to: tf.DType | None = None) -> float:
    """The absolute error allowed in a mean of `dtype` gradients, that of the
    narrower dtype when they travel compressed to `compressed_to`."""
    dtypes = [dtype] if compressed_to is None else [dtype, compressed_to]
    return max(TOLERANCE.get(d, 1e-5) for d in dtypes)


def even_elements(towers: int) -> int:
    """A float32 element count that 1, 2, ... `towers` all divide (x16, so
    that even one tower's buffer is more than a number)."""
    return 16 * math.lcm(*range(1, towers + 1))


def declared_traffic(reducer, devices: Sequence[str], destinations: Sequence[str],
                     nbytes: int) -> dict[str, int] | None:
    """The reducer's `traffic` figure without the silent devices; None without one."""
    traffic = getattr(reducer, "traffic", None)
    if not callable(traffic):
        return None
    figure = traffic(list(devices), list(destinations), nbytes)
    if figure is None:
        return None
    return {device: round(sent) for device, sent in figure.items() if round(sent)}


def sent_per_device(reducer, devices: Sequence[str], destinations: Sequence[str],
                    elements: int) -> tuple[dict[str, int | None], dict[str, int]]:
    """Bytes each device sends in one call on one float32 gradient of `elements`:
    from the call's _Send ops (None for a device that sent a tensor of unknown
    size), and from the schedule the cost model reads off the same function."""
    from engine.cost import schedule

    function, sent = measure.reduction_transfers(
        reducer, list(devices), list(destinations), [elements], tf.float32
    )
    per_device: dict[str, int | None] = {}
    for transfer in sent:
        src, size = transfer["src"], transfer["bytes"]
        if size is None or per_device.get(src, 0) is None:
            per_device[src] = None
        else:
            per_device[src] = per_device.get(src, 0) + size
    placed = {device: size for device, size in per_device.items() if size != 0}
    scheduled = schedule.from_graph(function.get_concrete_function().graph).sent_per_device()
    return placed, scheduled


def schedule_problem(placed: dict[str, int | None], scheduled: dict[str, int]) -> str | None:
    """The cost model's schedule sends other bytes than the placed call did?"""
    if placed == scheduled:
        return None
    return (f"the cost model's schedule of the call sends {scheduled}, the placed call "
            f"sent {placed}: TensorFlow moved an op off the device it asked for")


def traffic_problem(figure: dict[str, int], measured: dict[str, int | None]) -> str | None:
    """Measured bytes per device not the declared ones? Names each device that differs."""
    differences = []
    for device in sorted(set(figure) | set(measured)):
        want, got = figure.get(device, 0), measured.get(device, 0)
        if got is None:
            differences.append(f"{device} sent tensors of unknown size, declared {want}")
        elif got != want:
            differences.append(f"{device} sent {got} bytes, declared {want}")
    if not differences:
        return None
    return "; ".join(differences) + "; fix the algorithm or its traffic() figure"
