"""`tower-placement`: read, compare and draw placement logs."""

from __future__ import annotations

import json
import os
import sys

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


def _load_step(path: str, step: str) -> list[dict]:
    """The log at `path`, which must hold `step`."""
    from engine.placement.budgets import held

    entries = _load(path)
    if not any(e.get("step") == step for e in entries):
        raise UsageFailure(f"{path!r} has no {step} step; it holds: "
                           f"{', '.join(held(entries)) or 'neither train nor eval'}")
    return entries


def _check_output(output: str, suffixes: tuple[str, ...], fix: str) -> None:
    """-o must end with one of `suffixes` and lie in a directory that exists."""
    if not output.endswith(suffixes):
        raise UsageFailure(f"-o {output!r}: {fix}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise UsageFailure(f"-o {output!r}: its directory does not exist")


# Which captured step a command reads.
_STEP = click.option("--step", default="train", show_default=True,
                     type=click.Choice(["train", "eval"]),
                     help="Which captured step to read: the training step or the evaluation "
                     "step.")


@click.group(name="tower-placement", cls=OneLineGroup)
def tower_placement():
    """Read, compare and draw tower-train placement logs."""


@tower_placement.command()
@click.argument("log")
@click.option("--full", is_flag=True,
              help="Also why each op moved, peak memory per device and the profiled step's "
              "analysis (idle time, critical path, longest ops).")
def summary(log, full):
    """Ops per device per tower, the transfer matrix, stray ops and how many
    ops moved (what tower-train prints at the end)."""
    from engine.placement import summary as placement_text

    click.echo(placement_text.summary(_load(log), full))


@tower_placement.command()
@click.argument("log_a")
@click.argument("log_b")
def diff(log_a, log_b):
    """What changed from LOG_A to LOG_B."""
    from engine.placement import summary as placement_text

    click.echo(placement_text.diff(_load(log_a), _load(log_b)))


@tower_placement.command()
@click.argument("log")
@click.option("-o", "--output", required=True, help="out.svg, out.png or out.dot")
@_STEP
def render(log, output, step):
    """Draw devices as boxes and transfers as arrows labelled with bytes per step."""
    from engine.placement import render as placement_render

    _check_output(output, placement_render.FORMATS,
                  f"the picture is written as {', '.join(placement_render.FORMATS)}; end the "
                  "name with one of them")
    entries = _load_step(log, step)
    placement_render.render(entries, output, step)
    click.echo(f"wrote {output}")


@tower_placement.command()
@click.argument("log")
@click.option("-o", "--output", required=True, help="out.json: a Chrome trace (trace event JSON).")
@_STEP
def trace(log, output, step):
    """Write the profiled step as a Chrome trace for Perfetto or chrome://tracing:
    a track per device, ops as slices, transfers as arrows, memory as a counter."""
    from engine.errors import UsageError
    from towers.placement import write_trace

    _check_output(output, (".json",), "a trace is JSON; end the name with .json")
    entries = _load_step(log, step)
    notes = [e["text"] for e in entries if e.get("kind") == "note" and e["step"] == step]
    if notes:
        raise UsageFailure(f"{log!r}: {notes[0]}")
    try:
        events = write_trace(entries, output, step)["traceEvents"]
    except UsageError as err:
        raise UsageFailure(f"{log!r}: {err}") from None
    slices = sum(1 for e in events if e["ph"] == "X")
    flows = sum(1 for e in events if e["ph"] == "s")
    click.echo(f"wrote {output}: {slices} ops, {flows} transfers; open it in "
               "https://ui.perfetto.dev or chrome://tracing")


def _budget_options(function):
    options = [
        click.option("--max-bytes", "max_bytes", multiple=True, metavar="SRC->DST=N",
                     help="At most N bytes per step from SRC to DST, per device pair; "
                          "* for any device. Repeatable."),
        click.option("--max-total-bytes", type=click.IntRange(min=0), metavar="N",
                     help="At most N bytes per step between all devices."),
        click.option("--no-strays", is_flag=True, help="No tower op outside its device."),
        click.option("--max-peak-memory", "max_peak_memory", multiple=True,
                     metavar="DEVICE=N",
                     help="Peak memory of DEVICE (* for any) at most N bytes. Repeatable."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@tower_placement.command()
@click.argument("log")
@_STEP
@_budget_options
def check(log, step, max_bytes, max_total_bytes, no_strays, max_peak_memory):
    """Check a step against budgets: exit 1 with a line per violation, 0 if none."""
    from engine.placement import budgets

    budget = budgets.Budget(
        max_bytes=tuple(budgets.parse_pair(t, "max_bytes") for t in max_bytes),
        max_total_bytes=max_total_bytes,
        no_strays=no_strays,
        max_peak_memory=tuple(budgets.parse_device(t, "max_peak_memory")
                              for t in max_peak_memory),
    )
    if budget.empty:
        raise UsageFailure("give at least one budget: --max-bytes, --max-total-bytes, "
                           "--no-strays or --max-peak-memory")
    entries = _load_step(log, step)
    over = budgets.violations(entries, budget, step)
    for line in over:
        click.echo(line)
    skipped = budgets.unknown(entries, step)
    if skipped:
        click.echo(f"tower-placement: warning: {skipped} transfer(s) of unknown size were "
                   "not counted", err=True)
    if over:
        sys.exit(1)
    click.echo(f"{log}: the {step} step keeps to every budget")


def main():
    tower_placement.main(prog_name="tower-placement")
