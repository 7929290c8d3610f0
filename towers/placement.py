"""Reading a placement log in Python: the summary, the Chrome trace, the step
analysis and budgets.

    import towers
    towers.Trainer("cpu:2").fit(epochs=1, steps_per_epoch=3, eval_steps=2,
                                placement_log="run.jsonl")
    log = towers.placement.load("run.jsonl")
    print(towers.placement.summary(log))
    towers.placement.write_trace(log, "step.json")  # open in ui.perfetto.dev
    over = towers.placement.check(log, towers.placement.Budget(max_total_bytes=900_000))

The command line's `tower-placement` is a thin layer over these.
"""

from __future__ import annotations

import json

from engine.placement import analysis, budgets, report
from engine.placement import summary as summary_lib
from engine.placement import trace as _trace
from engine.placement.analysis import Analysis
from engine.placement.budgets import Budget

__all__ = ["Analysis", "Budget", "analyse", "check", "load", "summary", "write_trace"]


def load(path: str) -> list[dict]:
    """The records of a placement log written by `fit(placement_log=...)`.

    Args:
      path: the JSON Lines file.

    Returns:
      Its records, in order (the schema is in engine/placement/log.py).

    Raises:
      OSError: the file cannot be read.
      json.JSONDecodeError: it is not JSON Lines.
    """
    return report.load(path)


def summary(log: list[dict], full: bool = False) -> str:
    """The report `fit` prints at the end of a run with a placement log: ops
    per device, bytes between devices against what they should be, strays,
    and how many ops ran elsewhere than asked.

    Args:
      log: the records from `load`.
      full: add why each op moved, the peak memory per device and the
        profiled step's analysis (idle time, critical path, longest ops).

    Returns:
      The report, lines joined by newlines.
    """
    return summary_lib.summary(log, full)


def analyse(log: list[dict], step: str = "train") -> Analysis | None:
    """Busy and idle time per device, what each waited for, the critical
    path and the longest ops of the profiled `step`.

    Args:
      log: the records from `load`.
      step: `train` or `eval`.

    Returns:
      The analysis, or None when the log has no timings for `step` (the run
      took fewer than two such steps).
    """
    return analysis.analyse(log, step)


def write_trace(log: list[dict], path: str, step: str = "train") -> dict:
    """Writes the profiled `step` as a Chrome trace (Perfetto, chrome://tracing).

    Args:
      log: the records from `load`.
      path: the .json file to write.
      step: `train` or `eval`.

    Returns:
      The trace that was written (`{"traceEvents": [...]}`).

    Raises:
      UsageError: the log has no timings for `step`.
    """
    trace = _trace.chrome_trace(log, step)
    with open(path, "w") as stream:
        json.dump(trace, stream)
    return trace


def check(log: list[dict], budget: Budget, step: str = "train") -> list[str]:
    """The limits of `budget` that `step` goes over, one line each.

    Args:
      log: the records from `load`.
      budget: the limits (bytes per device pair, in all, strays, peak memory).
      step: `train` or `eval`.

    Returns:
      One line per violation naming the figure and the largest tensor over
      it; empty when the step keeps to the budget.

    Raises:
      UsageError: the log has no `step`; a device of `budget` is not one of
        the step's; `budget.max_peak_memory` is set and the log has no
        memory records. Transfers of unknown size are not counted.
    """
    return budgets.violations(log, budget, step)
