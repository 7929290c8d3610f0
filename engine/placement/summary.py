"""The placement log as text: the end-of-run summary, its reason and memory
lines, and the diff of two logs (engine.placement.report reads the entries)."""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

from engine.placement import analysis
from engine.placement.report import (
    STEPS,
    by_task,
    call,
    dense_ring_bytes,
    devices,
    expected_bytes,
    matrix,
    memory,
    ops,
    run_info,
    slices,
    strays,
    transfers,
    wanted_device,
)
from engine.scopes import PHASES

__all__ = ["diff", "memory_lines", "reason_lines", "summary"]

# What engine.placement.reasons.reason says of an op colocated with a
# variable (parsed here: reading a log needs no TensorFlow).
_COLOCATED = re.compile(r"^colocated with variable (\S+) on (\S+) \((.*)\)$")
# Up to _SEPARATE variables get a line each; past that, one line names
# _NAMED of them (the log keeps every op's reason: `tower-placement` reads it).
_SEPARATE, _NAMED = 8, 3


def _against_dense_ring(info: dict) -> str:
    """`(on an averaging step...); 4.0% of a dense ring's 2,442,480 (25.0x less)`."""
    note = f" ({info['reduction_note']})" if info.get("reduction_note") else ""
    dense, own = dense_ring_bytes(info), info["reduction_bytes"]
    if not dense:
        return note
    less = f", {dense / own:.1f}x less" if 0 < own < dense else ""
    return f"{note}; {100.0 * own / dense:.1f}% of a dense ring's {dense:,}{less}"


def _per_sample(total: int, info: dict) -> str:
    """`  per sample: 3,180 bytes (256 samples per step: 2 towers x 4 batches of 32)`:
    what a reducer costs per sample trained on, which gradient accumulation
    lowers (a step's one reduction serves its K batches)."""
    towers, batch = len(info["towers"]), info["batch_size"]
    accumulate = info.get("accumulate", 1)
    samples = towers * batch * accumulate
    batches = (f"{accumulate} accumulated batches of {batch}" if accumulate > 1
               else f"a batch of {batch}")
    return (f"  per sample: {total / samples:,.0f} bytes ({samples:,} samples per step: "
            f"{towers} tower{'s' * (towers > 1)} x {batches})")


def _owner_label(owner) -> str:
    return f"tower {owner}" if isinstance(owner, int) else owner


def _table(headers: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    cells = [list(map(str, headers))] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        first = row[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("    " + "  ".join([first, *rest]).rstrip())
    return lines


def _fmt(value) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def summary(entries: Sequence[dict], full: bool = False) -> str:
    """The end-of-run report: ops per device, traffic against what it should
    be, strays, and how many ops moved; `full` adds why they moved, peak
    memory and the profiled step's analysis (critical path, longest ops)."""
    info = run_info(entries)
    lines = []
    for step in STEPS:
        step_ops = ops(entries, step)
        if not step_ops:
            continue
        lines.append(f"placement of the {step} step ({len(step_ops)} ops):")
        order = {"input": 0, "reduce": 1, "other": 2}
        owners = sorted(
            {o["tower"] for o in step_ops},
            key=lambda x: (-1, x) if isinstance(x, int) else (order[x], 0),
        )
        counts = collections.Counter((o["assigned"], o["tower"]) for o in step_ops)
        rows = [
            [device, *(counts.get((device, owner), 0) for owner in owners)]
            for device in sorted({o["assigned"] for o in step_ops})
        ]
        lines.append("  ops per device:")
        lines += _table(["device", *map(_owner_label, owners)], rows)

        moved = matrix(entries, step)
        names = devices(e for e in entries if e.get("step") == step)
        lines.append("  bytes sent per step (row: from, column: to):")
        lines += _table(
            ["from \\ to", *names],
            [[src, *(moved.get((src, dst), "-") for dst in names)] for src in names],
        )
        total = sum(moved.values())
        unknown = sum(1 for t in transfers(entries, step) if t["bytes"] is None)
        want = expected_bytes(info, step)
        scheme = f"{info['reducer']} reduction, {info.get('variables', 'reduce-device')} variables"
        if info.get("reducer_choices"):
            chose = ", ".join(f"{name} for {lo:,}-{hi:,} bytes"
                              for lo, hi, name in info["reducer_choices"])
            scheme = f"auto reduction ({chose}), {info.get('variables', 'reduce-device')} variables"
        if want is None:
            expectation = f"; no expectation for the {scheme}"
        else:
            ratio = f" ({100.0 * total / want:.1f}%)" if want else ""
            expectation = f"{ratio}; the {scheme} should move {want:,}"
            if step == "train" and info.get("reduction_bytes") is not None:
                expectation += _against_dense_ring(info)
        lines.append(
            f"  total {total:,} bytes per step{expectation} (parameter bytes: "
            f"{info['parameter_bytes']:,})"
            + (f"; {unknown} transfer(s) of unknown size" if unknown else "")
        )
        if step == "train":
            lines.append(_per_sample(total, info))
        between = by_task(moved)
        if between:
            pairs = ", ".join(f"{a} -> {b} {n:,}" for (a, b), n in sorted(between.items()))
            lines.append(
                f"  between tasks (over the network): {sum(between.values()):,} bytes "
                f"per step: {pairs}"
            )
        step_strays = strays(step_ops)
        if step_strays:
            lines.append(f"  stray ops ({len(step_strays)}):")
            lines += [f"    {s['name']} ({s['op']}): {s['stray']}" for s in step_strays]
        else:
            lines.append("  stray ops: none")
        if not full:
            moved_ops = sum(1 for o in step_ops if o.get("reason"))
            if moved_ops:
                lines.append(f"  ops that ran elsewhere than asked: {moved_ops}")
            continue
        lines += reason_lines(step_ops, info["towers"])
        lines += memory_lines(entries, step)
        found = analysis.analyse(entries, step)
        if found is not None:
            lines += analysis.lines(found)
    return "\n".join(lines)


def _colocations_merged(groups: collections.Counter) -> collections.Counter:
    """Groups that differ only in the variable they were colocated with, as
    one line when there are more than a few (ResNet-50's tower 1 reads all
    320 of its variables on the reduce device)."""
    variables: dict[tuple, dict[str, tuple[int, str]]] = collections.defaultdict(dict)
    merged: collections.Counter = collections.Counter()
    for (owner, assigned, requested, reason), count in groups.items():
        match = _COLOCATED.match(reason)
        if match:
            key = (owner, assigned, requested, match.group(2), match.group(3))
            variables[key][match.group(1)] = (count, reason)
        else:
            merged[(owner, assigned, requested, reason)] += count
    for key, names in variables.items():
        owner, assigned, requested, where, why = key
        if len(names) <= _SEPARATE:
            for count, reason in names.values():
                merged[(owner, assigned, requested, reason)] = count
            continue
        # The variables with the most ops on the wrong device first.
        ranked = sorted(names, key=lambda name: (-names[name][0], name))
        listed = ", ".join(ranked[:_NAMED]) + f" and {len(ranked) - _NAMED} more"
        reason = (f"colocated with {len(ranked)} variables on {where} ({listed}, each "
                  f"named in the placement log; {why})")
        merged[(owner, assigned, requested, reason)] = sum(c for c, _ in names.values())
    return merged


def reason_lines(step_ops: Sequence[dict], towers: Sequence[str]) -> list[str]:
    """Ops that ran elsewhere than asked, grouped by who, where and why:
    `12 ops of tower 1 ran on /cpu:0, not /cpu:1: colocated with ...`."""
    groups = collections.Counter(
        (_owner_label(o["tower"]), o["assigned"],
         wanted_device(o["tower"], o["requested"], towers) or "", o["reason"])
        for o in step_ops if o.get("reason")
    )
    if not groups:
        return []
    out = [f"  ops that ran elsewhere than asked ({sum(groups.values())}):"]
    for (owner, assigned, requested, reason), count in sorted(
        _colocations_merged(groups).items(), key=lambda kv: (-kv[1], kv[0])
    ):
        wanted = f", not {requested}" if requested else ""
        ops_word = "op" if count == 1 else "ops"
        out.append(f"    {count} {ops_word} of {owner} ran on {assigned}{wanted}: {reason}")
    return out


# oneDNN's CPU allocator serves allocations under 256 KiB from a plain malloc
# that reports nothing to the profiler (engine.placement.timeline).
_PARTIAL_ALLOCATORS = ("mklcpu",)


def memory_lines(entries: Sequence[dict], step: str) -> list[str]:
    """Peak bytes per device and per phase, when the log has timings; each
    device that ran ops but reported no allocation is named, with why."""
    if call(entries, step) is None:
        return []
    records = memory(entries, step)
    logged = [r for other in STEPS for r in memory(entries, other).values()]
    partial = any(set(r.get("allocators", ())) & set(_PARTIAL_ALLOCATORS) for r in logged)
    small = (", on CPUs tensors of 256 KiB or more: oneDNN's allocator serves smaller "
             "ones unrecorded" if partial else "")
    out = [f"  peak memory per device (tensors allocated during one {step} step{small}):"]
    for device, record in sorted(records.items()):
        phases = ", ".join(f"{phase} {record['phases'][phase]:,}"
                           for phase in PHASES if phase in record["phases"])
        out.append(f"    {device}: {record['peak_bytes']:,} bytes"
                   + (f" (by phase: {phases})" if phases else ""))
    # A CPU allocation in any step of the log shows the allocator reports them:
    # a CPU device silent in this step made no new tensor (on a GPU run, the
    # CPU only reads the variables and sends them).
    cpu_reported = any("cpu:" in r["device"] for r in logged)
    silent = sorted({s["device"] for s in slices(entries, step)} - records.keys())
    for device in silent:
        if "cpu:" not in device:
            why = ""
        elif partial:
            why = ": none of 256 KiB or more"
        elif cpu_reported:
            why = ": its ops made no new tensor"
        else:
            why = (": TensorFlow's default CPU allocator reports none to the profiler; "
                   "start TensorFlow with TF_CPU_ALLOCATOR_USE_BFC=true (towers.Trainer "
                   "does) to see them all")
        out.append(f"    {device}: no allocations recorded{why}")
    return out


def diff(a: Sequence[dict], b: Sequence[dict]) -> str:
    """What changed from log A to log B: op devices, ops added and removed,
    and the transfer matrix."""
    lines = []
    for step in STEPS:
        ops_a = {o["name"]: o for o in ops(a, step)}
        ops_b = {o["name"]: o for o in ops(b, step)}
        if not ops_a and not ops_b:
            continue
        lines.append(f"{step} step:")
        moved = sorted(
            n for n in ops_a.keys() & ops_b.keys()
            if ops_a[n]["assigned"] != ops_b[n]["assigned"]
        )
        lines.append(f"  ops that changed device ({len(moved)}):")
        lines += [
            f"    {n}: {ops_a[n]['assigned']} -> {ops_b[n]['assigned']}" for n in moved
        ]
        for label, only in (("A", ops_a.keys() - ops_b.keys()), ("B", ops_b.keys() - ops_a.keys())):
            lines.append(f"  ops only in {label} ({len(only)}):")
            side = ops_a if label == "A" else ops_b
            lines += [f"    {n} ({side[n]['assigned']})" for n in sorted(only)]
        mat_a, mat_b = matrix(a, step), matrix(b, step)
        changes = sorted(
            (pair, mat_a.get(pair, 0), mat_b.get(pair, 0))
            for pair in mat_a.keys() | mat_b.keys()
            if mat_a.get(pair, 0) != mat_b.get(pair, 0)
        )
        lines.append(f"  transfer changes, bytes per step ({len(changes)}):")
        lines += [
            f"    {src} -> {dst}: {old:,} -> {new:,} ({new - old:+,})"
            for (src, dst), old, new in changes
        ]
        total_a, total_b = sum(mat_a.values()), sum(mat_b.values())
        lines.append(f"  total: {total_a:,} -> {total_b:,} ({total_b - total_a:+,}) bytes per step")
    return "\n".join(lines)
