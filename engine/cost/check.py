"""How well predictions match measurements: relative errors, and the order of reducers.

Rows are tower-reduce-bench's: dicts with `reducer`, `towers`,
`tensor_bytes`, `predicted_seconds` and the measured `best_seconds`, the
fastest of the timed calls: the model's costs are fitted from fastest calls
(engine/cost/fit.py), so that is what it predicts.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["order_agreement", "relative_errors"]

# Measured times closer than this (relative) have no order to get right.
DIFFERENT = 0.20


def relative_errors(rows: Sequence[dict]) -> list[float]:
    """(predicted - measured) / measured for each predicted row."""
    return [(r["predicted_seconds"] - r["best_seconds"]) / r["best_seconds"]
            for r in rows if r.get("predicted_seconds") is not None]


# Predicted times closer than this (relative) are a tie: the model has no order.
TIE = 0.02


def order_agreement(rows: Sequence[dict]) -> tuple[int, int, int]:
    """(pairs ordered as measured, pairs compared, pairs the model ties):
    pairs of reducers on the same towers and size whose measured times
    differ by more than DIFFERENT; a pair whose predictions are within TIE
    of each other (the same schedule, ring and tree on two towers) is a tie,
    counted apart."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("predicted_seconds") is not None:
            groups.setdefault((r["towers"], r["tensor_bytes"]), []).append(r)
    agree = compared = ties = 0
    for group in groups.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                fast, slow = sorted((a["best_seconds"], b["best_seconds"]))
                if slow <= fast * (1 + DIFFERENT):
                    continue
                low, high = sorted((a["predicted_seconds"], b["predicted_seconds"]))
                if high <= low * (1 + TIE):
                    ties += 1
                    continue
                compared += 1
                measured = a["best_seconds"] < b["best_seconds"]
                predicted = a["predicted_seconds"] < b["predicted_seconds"]
                agree += measured == predicted
    return agree, compared, ties
