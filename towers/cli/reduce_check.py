"""`tower-reduce-bench --check SPEC`: the conformance checks of one reducer
(engine/reducers/conformance.py) at every tower count, as a table of pass and
FAIL, a line per distinct failure, and the exit code 1 when any fails.
"""

from __future__ import annotations

import click

from towers.cli.common import UsageFailure

__all__ = ["check_table", "check_target", "failure_lines", "run_check"]


def check_target(spec: str, group_size: int, compress: str | None):
    """What `--check SPEC` checks, built anew for each placement: a built-in
    (with its parameters, `topk:ratio=0.05`), the user's
    `package.module:function`, or `:Class` of a StatefulReducer. Returns it
    and whether it serves replicated variables only (local SGD)."""
    from engine import reducers
    from engine.reducers.conformance import PerPlacement
    from engine.userfn import load_function

    if spec.partition(":")[0] not in reducers.BUILT_INS:
        if ":" not in spec:
            raise UsageFailure(
                f"--check {spec!r} is not one of {', '.join(reducers.BUILT_INS)} and not "
                "package.module:function"
            )
        load_function(spec, "check")  # a UsageError, which names --check
    try:
        options = reducers.ReducerOptions(name=spec, group_size=group_size, compress=compress)
    except reducers.ReducerError:
        raise  # OneLineCommand names the flags
    # New options per placement: a class is instantiated for each.
    target = PerPlacement(lambda placement: reducers.build(
        reducers.ReducerOptions(name=spec, group_size=group_size, compress=compress), placement))
    return target, options.method == "localsgd"


def check_table(rows, counts) -> str:
    """Rows: the checks; columns: the tower counts; cells: pass, FAIL or -."""
    from engine.reducers.conformance import CHECKS

    lines = [f"{'towers':<11}" + "".join(f"{n:>6}" for n in counts)]
    unchecked = False
    for name in CHECKS:
        if name == "traffic" and not any(r.name == name for r in rows):
            continue  # no figure declared: said below the table
        cells = []
        for n in counts:
            ran = [r.passed for r in rows if r.name == name and r.towers == n]
            cells.append("-" if not ran else "pass" if all(ran) else "FAIL")
        lines.append(f"{name:<11}" + "".join(f"{c:>6}" for c in cells))
        unchecked = unchecked or "-" in cells
    if unchecked:
        lines.append("-: not checked (a check it needs failed, no traffic figure, or a "
                     "lossy reducer: feedback instead of mean, where it keeps residuals)")
    return "\n".join(lines)


def failure_lines(rows) -> list[str]:
    """One line per distinct failure: the check, the tower count, the cases, why."""
    cases: dict[tuple, list] = {}
    for r in rows:
        if not r.passed:
            cases.setdefault((r.name, r.towers, r.detail), []).append(r)
    lines = []
    for (name, towers, detail), failed in cases.items():
        dtypes = ", ".join(dict.fromkeys(r.dtype for r in failed))
        kinds = " and ".join(dict.fromkeys(r.destinations for r in failed))
        count = f"{towers} tower{'s' if towers > 1 else ''}"
        lines.append(f"FAIL {name} with {count} ({dtypes}; {kinds}): {detail}")
    return lines


def run_check(spec, placement, reduce_device, group_size, compress) -> int:
    """Prints the conformance table of `spec`; returns the exit code."""
    from engine.reducers import conformance
    from engine.reducers.base import COMPRESSION

    target, replicated_only = check_target(spec, group_size, compress)
    devices = list(placement.devices)
    counts = list(range(1, len(devices) + 1))
    sent_as = f", sent as {compress}" if compress else ""
    click.echo(f"checking {spec}: towers on {', '.join(devices)}, reduce device "
               f"{reduce_device}, gradients in "
               f"{', '.join(d.name for d in conformance.DTYPES)}{sent_as}")

    def progress(n, rows):
        failed = sum(not r.passed for r in rows)
        click.echo(f"checked {n} tower{'s' if n > 1 else ''}: {len(rows)} checks, "
                   f"{failed} failed", err=True)

    kinds = (conformance.REPLICATED,) if replicated_only else (
        conformance.REPLICATED, conformance.REDUCE_DEVICE)
    rows = conformance.check(target, devices, reduce_device=reduce_device,
                             compressed_to=COMPRESSION.get(compress), progress=progress,
                             kinds=kinds)
    click.echo(check_table(rows, counts))
    if not any(r.name == "traffic" for r in rows):
        click.echo("traffic: no figure declared (a traffic() method; see "
                   "engine/reducers/conformance.py)")
    for line in failure_lines(rows):
        click.echo(line)
    failed = sum(not r.passed for r in rows)
    click.echo(f"{failed} of {len(rows)} checks failed" if failed
               else f"{len(rows)} checks passed")
    return 1 if failed else 0
