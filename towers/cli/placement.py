"""`tower-placement`: read, compare and draw placement logs."""

from __future__ import annotations

import json
import os

import click

from towers.cli.common import OneLineGroup, UsageFailure


def _load(path: str) -> list[dict]:
    from engine.placement import report as placement_report

    try:
        entries = placement_report.load(path)
    except OSError as err:
        raise UsageFailure(f"cannot read placement log {path!r}: {err.strerror}")
    except json.JSONDecodeError as err:
        raise UsageFailure(f"{path!r} is not a placement log (bad JSON at line {err.lineno})")
    if not any(e.get("kind") == "run" for e in entries):
        raise UsageFailure(
            f"{path!r} is not a placement log: no 'run' record; write one with "
            "tower-train --placement-log FILE"
        )
    return entries


@click.group(name="tower-placement", cls=OneLineGroup)
def tower_placement():
    """Read, compare and draw tower-train placement logs."""


@tower_placement.command()
@click.argument("log")
def summary(log):
    """Ops per device per tower, the transfer matrix, and stray ops."""
    from engine.placement import report as placement_report

    click.echo(placement_report.summary(_load(log)))


@tower_placement.command()
@click.argument("log_a")
@click.argument("log_b")
def diff(log_a, log_b):
    """What changed from LOG_A to LOG_B."""
    from engine.placement import report as placement_report

    click.echo(placement_report.diff(_load(log_a), _load(log_b)))


@tower_placement.command()
@click.argument("log")
@click.option("-o", "--output", required=True, help="out.svg, out.png or out.dot")
@click.option("--step", default="train", show_default=True,
              type=click.Choice(["train", "eval"]))
def render(log, output, step):
    """Draw devices as boxes and transfers as arrows labelled with bytes per step."""
    from engine.placement import render as placement_render

    if not output.endswith(placement_render.FORMATS):
        raise UsageFailure(
            f"-o {output!r}: the picture is written as "
            f"{', '.join(placement_render.FORMATS)}; end the name with one of them"
        )
    if not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise UsageFailure(f"-o {output!r}: its directory does not exist")
    entries = _load(log)
    if not any(e.get("step") == step for e in entries):
        raise UsageFailure(f"{log!r} has no {step} step; it holds: train, eval or neither")
    placement_render.render(entries, output, step)
    click.echo(f"wrote {output}")


def main():
    tower_placement.main(prog_name="tower-placement")
