"""How much of a step's reduction ran while backward was still running.

On GPUs the step's speed depends on hiding the reduction behind the backward
pass: a bucket of the last layers' gradients can be reduced while the first
layers' gradients are computed (engine.reducers.packing). From a profiled
step's slices (engine.placement.timeline) this measures it: the time some
reduction op ran, and the part of that time some backward op ran too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from engine import scopes

__all__ = ["Overlap", "busy", "overlap"]


@dataclasses.dataclass(frozen=True)
class Overlap:
    """The reduction's time, and how much of it backward hid.

    Attributes:
      reduce_us: microseconds in which at least one reduction op ran.
      hidden_us: the part of them in which a backward op ran as well.
      first_reduce_us: when the first reduction op started (from the call's
        start), or None without reduction ops.
      backward_end_us: when the last backward op ended.
    """

    reduce_us: float
    hidden_us: float
    first_reduce_us: float | None
    backward_end_us: float

    @property
    def hidden_fraction(self) -> float:
        """hidden_us / reduce_us; 0 when nothing was reduced."""
        return self.hidden_us / self.reduce_us if self.reduce_us else 0.0


def busy(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """`intervals` merged where they touch or overlap, in time order."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(slices: Iterable[dict]) -> Overlap:
    """The overlap of reduction and backward in one profiled call.

    Args:
      slices: the call's slice records (engine.placement.report.slices);
        reduction ops are those under `reduce/` (the phase `reduce`, not the
        optimizer's `update`), backward ops those under `gradient_tape/tower_K/`.

    Returns:
      The Overlap.
    """
    reduce, backward = [], []
    for s in slices:
        phase = s.get("phase") or scopes.phase(s["name"])
        interval = (s["start_us"], s["start_us"] + s["dur_us"])
        if phase == scopes.REDUCE:
            reduce.append(interval)
        elif phase == "backward":
            backward.append(interval)
    reduce_busy, backward_busy = busy(reduce), busy(backward)
    return Overlap(
        reduce_us=_length(reduce_busy),
        hidden_us=_intersection(reduce_busy, backward_busy),
        first_reduce_us=reduce_busy[0][0] if reduce_busy else None,
        backward_end_us=backward_busy[-1][1] if backward_busy else 0.0,
    )
