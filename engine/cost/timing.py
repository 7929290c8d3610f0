"""Timing calls on a shared machine: in interleaved rounds, fastest call kept.

On a shared host the same call can take twice as long a minute later. Timing
one function's calls after another's would compare them on different
machines, and a figure fitted from them would follow the machine's mood. In
rounds (one call of each function per round, the order rotating), every
function meets the same machine, and each one's fastest call comes from the
whole measuring window, not from the second or two its own calls took.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

__all__ = ["fastest", "interleaved"]


def interleaved(functions: Sequence[Callable[[], object]], repeats: int,
                warmup: int) -> list[list[float]]:
    """Seconds of `repeats` calls of each function, timed in rounds.

    Args:
      functions: what to time, each called with no arguments.
      repeats: timed calls of each.
      warmup: untimed rounds first (tracing, first-use allocations).

    Returns:
      One list of `repeats` durations per function, in `functions`' order.
    """
    for _ in range(warmup):
        for function in functions:
            function()
    times: list[list[float]] = [[] for _ in functions]
    for round_ in range(repeats):
        for k in range(len(functions)):
            k = (k + round_) % len(functions)
            start = time.perf_counter()
            functions[k]()
            times[k].append(time.perf_counter() - start)
    return times


def fastest(functions: Sequence[Callable[[], object]], repeats: int,
            warmup: int) -> list[float]:
    """The fastest of `repeats` calls of each function, timed in rounds: on a
    shared machine the slow calls are other tenants' work, and how many there
    are changes by the minute; the fastest is the machine's own cost."""
    return [min(t) for t in interleaved(functions, repeats, warmup)]
