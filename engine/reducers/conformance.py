"""Conformance: the checks every reducer must pass, the built-ins and your own.

The contract (base.py): `reducer(tower_grads, devices, destinations)` returns,
for each destination, the mean over towers of each variable's gradient, made
on that destination, in the gradient's shape and dtype. `check` runs a
reducer on generated gradients (a matrix, a vector, a scalar) for each tower
count, both kinds of destinations (every tower's device, as for replicated
variables; the reduce device alone) and each dtype, and returns one
`CheckResult` per check:

* runs: the call returns; an exception is a failed row naming it;
* structure: one list per destination, one tensor per variable;
* shape, dtype: the gradients' own;
* placement: each result made on its destination;
* mean: the mean, not the sum; a wrong result names the factor it is off by;
* traffic: the bytes each device sends, where the reducer declares them, and
  the same bytes in the schedule the cost model reads (engine/cost);
* feedback: for a stateful reducer that compresses (`lossy`) and keeps
  `residuals`, over several calls what it sent plus what it holds back is
  what it was given (the error-feedback invariant). A lossy reducer's single
  call is not the mean, so it gets this check instead of `mean`.

A stateful reducer (engine.reducers.stateful) is built afresh for every
call the checks make, for the call's gradients, devices and destinations.

A reducer declares its traffic with one optional method:

    reducer.traffic(devices, destinations, nbytes) -> dict[str, int] | None

`devices` and `destinations` are as in the call; `nbytes` is the size of one
tower's gradient, a single float32 variable whose element count every tower
count up to len(devices) divides, so that chunked algorithms have exact
figures. It returns the bytes each device sends in one call (devices that
send nothing may be left out), or None where the algorithm has no fixed
figure, e.g. an all-reduce whose result one destination alone needs, where
TensorFlow prunes the hops that feed no one. The check counts the bytes of
the `_Send` ops in the partitioned graph of one call, device by device, and
wants the figure exactly. Collectives and NCCL move data without `_Send`, so
a reducer built on them should declare nothing. central, ring and tree
declare theirs.

`ReducerTestBase` makes these checks pytest tests of your own reducer:

    class TestMyReducer(ReducerTestBase):
        def make_reducer(self, placement):
            return my_reducer

From the shell: tower-reduce-bench's check of `package.module:function`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from engine.reducers import conformance_checks as checks
from engine.reducers.base import Reducer
from engine.reducers.conformance_checks import exact_mean_factor
from engine.reducers.stateful import stateful_part
from engine.topology.devices import Placement, Tower, canonical

if TYPE_CHECKING:
    import pytest

__all__ = [
    "CHECKS", "CheckResult", "PerPlacement", "ReducerTestBase", "assert_all_passed",
    "check", "check_call", "exact_mean_factor",
]

CHECKS = ("runs", "structure", "shape", "dtype", "placement", "mean", "traffic", "feedback")
DTYPES = (tf.float32, tf.float16, tf.float64)
SHAPES = ((5, 3), (7,), ())
REPLICATED, REDUCE_DEVICE = "replicated", "reduce-device"


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One check of one kind of call.

    Attributes:
      name: the check, one of CHECKS.
      towers: how many towers the call had.
      destinations: `replicated` (every tower's device) or `reduce-device`.
      dtype: the gradients' dtype, e.g. `float32`.
      passed: whether the reducer passed it.
      detail: why not, in one line; empty when it passed.
    """

    name: str
    towers: int
    destinations: str
    dtype: str
    passed: bool
    detail: str = ""

    def __str__(self) -> str:
        verdict = "pass" if self.passed else f"FAIL: {self.detail}"
        towers = f"{self.towers} tower{'s' if self.towers > 1 else ''}"
        return f"{self.name}, {towers}, {self.dtype}, {self.destinations}: {verdict}"


@dataclasses.dataclass(frozen=True)
class PerPlacement:
    """A reducer that `check` builds anew for each placement: `make(placement)`.

    For reducers made for their devices: `central` for its reduce device,
    `collective` for its group.
    """

    make: Callable[[Placement], Reducer]


def check_call(reducer: Reducer, arrays, devices: Sequence[str],
               destinations: Sequence[str], dtype=tf.float32, *,
               compressed_to: tf.DType | None = None,
               kind: str | None = None) -> list[CheckResult]:
    """Checks one call of `reducer` on `arrays[k][v]`, placed on `devices[k]`.

    Args:
      reducer: the reducer under test.
      arrays: tower k's gradient for variable v, as NumPy arrays.
      devices, destinations: as in the reducer contract (canonical names).
      dtype: the gradients' dtype.
      compressed_to: the dtype the reducer sends gradients in, if narrower:
        the mean is then checked to that dtype's precision.
      kind: the `destinations` label of the rows; by default `replicated`
        when the destinations are the devices, else `reduce-device`.

    Returns:
      Rows for runs, structure, shape, dtype, placement and mean; after a
      failed one, the checks that depend on it are left out.
    """
    dtype = tf.as_dtype(dtype)
    if kind is None:
        kind = REPLICATED if list(destinations) == list(devices) else REDUCE_DEVICE

    def row(name, problem):
        return CheckResult(name, len(devices), kind, dtype.name, problem is None, problem or "")

    try:
        symbolic, values, on_device = checks.run_call(reducer, arrays, devices, destinations, dtype)
    except Exception as err:
        return [row("runs", f"raised {checks.one_line(err)}")]
    rows = [row("runs", None), row("structure", checks.structure_problem(
        symbolic, destinations, len(arrays[0])))]
    if not rows[-1].passed:
        return rows
    shapes, dtypes, placement = checks.result_problems(
        symbolic, values, destinations, arrays, dtype, on_device)
    rows += [row("shape", checks.first(shapes)), row("dtype", checks.first(dtypes)),
             row("placement", checks.first(placement))]
    if shapes:
        return rows
    tolerance = checks.tolerance(dtype, compressed_to)
    state = stateful_part(reducer)
    if state is not None and state.lossy:
        if not hasattr(state, "residuals"):
            return rows  # no residuals: nothing to hold the result to
        rng = np.random.default_rng(len(devices))
        steps = [arrays] + [[[rng.normal(size=np.shape(a)) for a in tower] for tower in arrays]
                            for _ in range(checks.FEEDBACK_STEPS - 1)]
        try:
            problem = checks.feedback_problem(reducer, steps, devices, destinations, dtype,
                                              tolerance)
        except Exception as err:
            problem = f"raised {checks.one_line(err)}"
        return rows + [row("feedback", problem)]
    problem = checks.mean_problem(values, checks.exact_means(arrays, dtype), destinations,
                                  len(devices), tolerance)
    return rows + [row("mean", problem)]


def _traffic_rows(reducer, devices, destinations, kind) -> list[CheckResult]:
    elements = checks.even_elements(len(devices))
    try:
        checks.build_for(reducer, [(elements,)], devices, destinations, tf.float32)
        figure = checks.declared_traffic(reducer, devices, destinations, 4 * elements)
        if figure is None:
            return []
        placed, scheduled = checks.sent_per_device(reducer, devices, destinations, elements)
        problem = (checks.traffic_problem(figure, placed)
                   or checks.schedule_problem(placed, scheduled))
    except Exception as err:
        problem = f"raised {checks.one_line(err)}"
    return [CheckResult("traffic", len(devices), kind, "float32", problem is None,
                        problem or "")]


def _placement(towers: Sequence[str], reduce_device: str) -> Placement:
    return Placement(tuple(Tower(i, d, len(towers)) for i, d in enumerate(towers)),
                     reduce_device)


def check(reducer: Reducer | PerPlacement, devices: Sequence[str], *,
          reduce_device: str | None = None, tower_counts: Sequence[int] | None = None,
          dtypes: Sequence[tf.DType] = DTYPES, shapes: Sequence[tuple] = SHAPES,
          compressed_to: tf.DType | None = None, seed: int = 0,
          progress: Callable[[int, list[CheckResult]], None] | None = None,
          kinds: Sequence[str] = (REPLICATED, REDUCE_DEVICE),
          ) -> list[CheckResult]:
    """Runs the conformance checks (module docstring) on `reducer`.

    Args:
      reducer: the reducer under test, or a PerPlacement that builds it.
      devices: the devices towers may run on; N towers run on the first N.
      reduce_device: the reduce device; by default the last of `devices`,
        so that it is a tower for the largest count only.
      tower_counts: how many towers to try; by default 1 to len(devices).
      dtypes: the gradients' dtypes.
      shapes: the variables' shapes.
      compressed_to: the dtype the reducer sends gradients in, if narrower
        (`compress`): the mean is then checked to that dtype's precision.
      seed: seeds the generated gradients.
      progress: called after each tower count with it and its rows.
      kinds: the kinds of destinations to try: `replicated` (every tower's
        device) and `reduce-device`; local SGD serves replicated alone.

    Returns:
      One row per check, tower count, kind of destinations and dtype (the
      traffic check measures float32 alone).

    Raises:
      TypeError: for devices given as one string.
      ValueError: for a device that is not here, or a tower count that is
        not between 1 and len(devices).
    """
    if isinstance(devices, str):
        raise TypeError(f"devices {devices!r} is one string; pass a list of device "
                         "names, e.g. ['/cpu:0', '/cpu:1']")
    devices = checks.device_names(devices, "devices")
    if not devices:
        raise ValueError("devices is empty; pass the devices towers run on, e.g. ['/cpu:0']")
    (reduce_device,) = checks.device_names([reduce_device or devices[-1]], "reduce_device")
    counts = list(range(1, len(devices) + 1) if tower_counts is None else tower_counts)
    for n in counts:
        if not 1 <= n <= len(devices):
            raise ValueError(f"tower_counts: {n} is not between 1 and {len(devices)} "
                             f"(the devices given); pass more devices or fewer towers")
    rows = []
    for n in counts:
        towers, first = devices[:n], len(rows)
        placement = _placement(towers, reduce_device)
        rng = np.random.default_rng(seed + n)
        arrays = [[rng.normal(size=s) for s in shapes] for _ in towers]
        cases = {REPLICATED: list(towers), REDUCE_DEVICE: [reduce_device]}
        if cases[REDUCE_DEVICE] == cases[REPLICATED] and REPLICATED in kinds:
            del cases[REDUCE_DEVICE]  # one tower on the reduce device: one case
        for kind, destinations in cases.items():
            if kind not in kinds:
                continue
            try:
                built = reducer.make(placement) if isinstance(reducer, PerPlacement) else reducer
            except Exception as err:
                rows += [CheckResult("runs", n, kind, tf.as_dtype(d).name, False,
                                     f"building it raised {checks.one_line(err)}") for d in dtypes]
                continue
            calls = len(rows)
            for dtype in dtypes:
                rows += check_call(built, arrays, towers, destinations, dtype,
                                   compressed_to=compressed_to, kind=kind)
            if all(r.passed for r in rows[calls:] if r.name == "runs"):
                rows += _traffic_rows(built, towers, destinations, kind)
        if progress is not None:
            progress(n, rows[first:])
    return rows


def assert_all_passed(rows: Sequence[CheckResult]) -> None:
    """Raises AssertionError listing the failed rows, if any; and if no rows."""
    failed = [r for r in rows if not r.passed]
    if failed or not rows:
        raise AssertionError(
            f"{len(failed)} of {len(rows)} checks failed:\n" + "\n".join(map(str, failed))
        )


class ReducerTestBase:
    """The conformance checks as pytest tests; subclass it for your reducer.

    Override `make_reducer`; pytest collects the tests of subclasses named
    `Test...`. Split the host CPU into logical devices before the tests run
    (tf.config.set_logical_device_configuration, in conftest.py) to try
    several towers on one machine.

    Attributes:
      devices: the devices towers run on; None for every logical CPU device.
      reduce_device: None for the last of the devices.
      dtypes: the dtypes the property test draws from.
      examples: how many cases the property test draws.
    """

    devices: Sequence[str] | None = None
    reduce_device: str | None = None
    dtypes: Sequence[tf.DType] = (tf.float32, tf.float64, tf.float16)
    examples = 12

    def make_reducer(self, placement: Placement) -> Reducer:
        """Your reducer, for towers on `placement.devices`.

        Args:
          placement: the towers and reduce device of the case under test.
        """
        raise NotImplementedError(
            f"{type(self).__name__}.make_reducer(placement) is not defined; "
            "override it to return the reducer under test"
        )

    def tower_devices(self) -> list[str]:
        """`devices`, or every logical CPU device when it is None."""
        if self.devices is not None:
            return list(self.devices)
        return [canonical(d.name) for d in tf.config.list_logical_devices("CPU")]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """pytest's hook: one test_mean_on_every_tower_count per tower count.

        Args:
          metafunc: pytest's, for the test being collected.
        """
        if "num_towers" in metafunc.fixturenames:
            metafunc.parametrize("num_towers", range(1, len(self.tower_devices()) + 1))

    def test_mean_on_every_tower_count(self, num_towers: int) -> None:
        rows = check(PerPlacement(self.make_reducer), self.tower_devices(),
                     reduce_device=self.reduce_device, tower_counts=[num_towers],
                     dtypes=(tf.float32,), seed=num_towers)
        assert_all_passed(rows)

    def test_mean_for_any_shapes_dtypes_and_towers(self):
        try:
            from hypothesis import given, settings
            from hypothesis import strategies as st
        except ImportError:
            import pytest

            pytest.skip("needs hypothesis: pip install 'tower-train[test]'")
        devices = checks.device_names(self.tower_devices(), "devices")

        @settings(max_examples=self.examples, deadline=None)
        @given(data=st.data())
        def any_case(data):
            n = data.draw(st.integers(1, len(devices)), label="towers")
            dtype = data.draw(st.sampled_from(list(self.dtypes)), label="dtype")
            shapes = data.draw(st.lists(st.lists(st.integers(1, 9), max_size=3).map(tuple),
                                        min_size=1, max_size=4), label="shapes")
            replicated = data.draw(st.booleans(), label="replicated")
            reduce_device = data.draw(st.sampled_from(devices), label="reduce device")
            rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
            arrays = [[rng.uniform(-4, 4, size=s) for s in shapes] for _ in range(n)]
            towers = devices[:n]
            placement = _placement(towers, reduce_device)
            destinations = list(towers) if replicated else [reduce_device]
            reducer = self.make_reducer(placement)
            assert_all_passed(check_call(reducer, arrays, towers, destinations, dtype))

        any_case()
