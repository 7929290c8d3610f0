"""A run's time on a machine it did not run on, by the cost model.

The reduction is priced by the cost model on the scale's towers. A built-in
the model traces (MODELLED) is priced as itself on the run's gradient bytes;
any other reducer as a ring all-reduce of the bytes it sends: its measured
bytes per step, as a share of a dense ring's here, times the gradient bytes.
The compute of a step is the scale's `compute_ms`, else the run's step time
measured here (a worker's share of it where the towers were simulated on one
device, which runs them in turn). A step is compute plus reduction (no overlap assumed), and an
epoch of the same data takes `steps here x towers here / towers there` steps.
"""

from __future__ import annotations

import functools
import math

from towers.study.scales import Scale

__all__ = ["predict"]


@functools.lru_cache(maxsize=None)
def _reduction_seconds(topology: str, towers: int, reducer: str, nbytes: int) -> float:
    from towers import cost

    machine = cost.load(topology)
    devices = cost.towers_of(machine)[:towers]
    [row] = cost.compare(machine, [reducer], [max(4, nbytes)], towers=devices)
    return row.seconds


def predict(run: dict, scale: Scale) -> dict:
    """The run's predicted step and epoch on `scale`.

    Args:
      run: a run's figures: `method` (the built-in it is, or None),
        `parameter_bytes`, `towers`, `bytes_ratio` (its bytes per step over a
        dense ring's here), `step_seconds`, `steps_per_epoch` and `simulated`
        (towers that shared one device here; 1 if none did).
      scale: the machine and its tower count.

    Returns:
      `modelled_as` (the reducer priced), `reduced_bytes` (per tower),
      `reduction_ms`, `compute_ms`, `step_ms`, `steps_per_epoch` and
      `epoch_seconds`.
    """
    from towers.cost import MODELLED

    if run["method"] in MODELLED:
        modelled, nbytes = run["method"], run["parameter_bytes"]
    else:
        modelled = "ring"
        nbytes = int(round(run["parameter_bytes"] * run["bytes_ratio"]))
    reduction = _reduction_seconds(scale.topology, scale.towers, modelled, nbytes)
    # Towers simulated on one device ran in turn: a worker's compute is its share.
    shared = run.get("simulated", 1)
    compute = scale.compute_ms / 1e3 if scale.compute_ms else run["step_seconds"] / shared
    steps = math.ceil(run["steps_per_epoch"] * run["towers"] / scale.towers)
    step = compute + reduction
    return {"modelled_as": modelled, "reduced_bytes": nbytes,
            "reduction_ms": 1e3 * reduction, "compute_ms": 1e3 * compute,
            "step_ms": 1e3 * step, "steps_per_epoch": steps, "epoch_seconds": steps * step}
