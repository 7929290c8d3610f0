"""tower-train's one line for a TensorFlow error during training: the tower
that hit it and, for a sample DALI could not decode, the sample(s) at fault,
found by checking the data with a line of progress as it goes.
"""

from __future__ import annotations

import click

__all__ = ["explain"]


def explain(err, placement, info) -> str:
    """One line for a TensorFlow error during training; for a sample DALI
    could not decode, the tower that hit it and the sample(s) at fault."""
    from engine.data import check as data_check

    message = str(err.message)
    tower = data_check.failing_tower(message)
    where = ""
    if tower is not None and tower < len(placement.towers):
        where = f"tower {tower} ({placement.towers[tower].device}): "
    if data_check.is_decode_failure(message) and info.train_path and info.format != "pipeline":
        click.echo(f"tower-train: {where}DALI could not decode an image; "
                   f"checking {info.train_path} for the sample at fault...", err=True)

        def progress(count: int) -> None:
            click.echo(f"  {count} samples checked", err=True)

        bad = data_check.undecodable(info.format, info.train_path, progress)
        if info.val_path:
            bad += data_check.undecodable(info.format, info.val_path, progress)
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            return (f"{where}cannot decode {', '.join(bad[:3])}{more}; remove or "
                    "replace what is not a valid image")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = next(
        (line for line in lines if "failure" in line or "rror" in line.split(":")[0]),
        lines[0] if lines else type(err).__name__,
    )
    return f"training failed: {where}{detail}"
