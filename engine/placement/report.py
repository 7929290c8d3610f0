"""Reading placement logs: the summary, the expected traffic, and diffs."""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable, Sequence

from engine.core.scopes import PHASES
from engine.topology.devices import task_of

STEPS = ("train", "eval")


def load(path: str) -> list[dict]:
    """The entries of a placement log (the schema is in engine/placement.py)."""
    with open(path) as stream:
        return [json.loads(line) for line in stream if line.strip()]


def ops(entries: Iterable[dict], step: str) -> list[dict]:
    return [e for e in entries if e["kind"] == "op" and e["step"] == step]


def transfers(entries: Iterable[dict], step: str) -> list[dict]:
    return [e for e in entries if e["kind"] == "transfer" and e["step"] == step]


def slices(entries: Iterable[dict], step: str) -> list[dict]:
    """The profiled executions of the step's nodes (engine.placement.timeline)."""
    return [e for e in entries if e["kind"] == "slice" and e["step"] == step]


def call(entries: Iterable[dict], step: str) -> dict | None:
    """The profiled call of the step, or None when the log has no timings."""
    return next((e for e in entries if e["kind"] == "call" and e["step"] == step), None)


def memory(entries: Iterable[dict], step: str) -> dict[str, dict]:
    """Memory records of the step by device."""
    return {e["device"]: e for e in entries if e["kind"] == "memory" and e["step"] == step}


def run_info(entries: Sequence[dict]) -> dict:
    return next(e for e in entries if e["kind"] == "run")


def devices(entries: Iterable[dict]) -> list[str]:
    """Every device that ran an op or sent or received a tensor, sorted."""
    found = set()
    for e in entries:
        if e["kind"] == "op":
            found.add(e["assigned"])
        elif e["kind"] == "transfer":
            found.update((e["src"], e["dst"]))
    return sorted(found)


def matrix(entries: Iterable[dict], step: str) -> dict[tuple[str, str], int]:
    """Known bytes per call of the step, by (source, destination) device."""
    out: dict[tuple[str, str], int] = collections.Counter()
    for t in transfers(entries, step):
        if t["bytes"] is not None:
            out[(t["src"], t["dst"])] += t["bytes"]
    return dict(out)


ALL_REDUCES = ("ring", "tree", "hierarchical")


def reduction_bytes(info: dict) -> int | None:
    """Bytes the gradient reduction alone should move per step, or None.

    * central: each tower off the reduce device sends its gradients there
      (parameter bytes P); with replicated variables the mean comes back (P).
    * ring, tree, hierarchical with replicated variables: an all-reduce moves
      2(N-1) x P in total, however it is routed (ring: 2(N-1)/N x P per
      device). With variables on the reduce device only one device needs the
      result and TensorFlow prunes the hops that feed no one: no fixed figure.
    * --compress halves the traffic of float32 gradients.
    * a stateful reducer (topk, powersgd, signsgd, localsgd, or one of yours
      with a `traffic` figure) gives its own: `reduction_bytes` in the log.
    * collective, nccl and user reducers move tensors TensorFlow does not show
      as _Send/_Recv, or in ways unknown here: None.
    """
    if info.get("reduction_bytes") is not None:
        return info["reduction_bytes"]
    p = info["parameter_bytes"]
    towers, reduce_device = info["towers"], info["reduce_device"]
    replicated = info.get("variables") == "replicated"
    narrow = 0.5 if info.get("compress") else 1.0
    reducer = info.get("reducer", "central")
    if reducer == "central":
        remote = sum(1 for d in towers if d != reduce_device)
        return int(narrow * remote * p * (2 if replicated else 1))
    if reducer in ALL_REDUCES and replicated:
        return int(narrow * 2 * (len(towers) - 1) * p)
    return None


def expected_bytes(info: dict, step: str) -> int | None:
    """What a step should move: with variables on the reduce device, every tower
    off it reads every variable (P, train and eval); training adds the
    reduction (`reduction_bytes`). None when the reduction's figure is unknown."""
    p = info["parameter_bytes"]
    replicated = info.get("variables") == "replicated"
    remote = sum(1 for d in info["towers"] if d != info["reduce_device"])
    reads = 0 if replicated else remote * p
    if step == "eval":
        return reads
    reduction = reduction_bytes(info)
    return None if reduction is None else reads + reduction


def dense_ring_bytes(info: dict) -> int:
    """Bytes a dense ring all-reduce of every gradient sends per step: 2(N-1) P."""
    return 2 * (len(info["towers"]) - 1) * info["parameter_bytes"]


def _against_dense_ring(info: dict) -> str:
    """`(on an averaging step...); 4.0% of a dense ring's 2,442,480 (25.0x less)`."""
    note = f" ({info['reduction_note']})" if info.get("reduction_note") else ""
    dense, own = dense_ring_bytes(info), info["reduction_bytes"]
    if not dense:
        return note
    less = f", {dense / own:.1f}x less" if 0 < own < dense else ""
    return f"{note}; {100.0 * own / dense:.1f}% of a dense ring's {dense:,}{less}"


def strays(entries: Iterable[dict]) -> list[dict]:
    return [e for e in entries if e["kind"] == "op" and e["stray"]]


def _owner_label(owner) -> str:
    return f"tower {owner}" if isinstance(owner, int) else owner


LOCAL_TASK = "this process"


def by_task(moved: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Bytes between tasks (processes, so machines apart or not), per ordered
    pair of `/job:J/task:T` (or LOCAL_TASK); transfers within a task left out."""
    totals: dict[tuple[str, str], int] = collections.defaultdict(int)
    for (src, dst), count in moved.items():
        a, b = task_of(src) or LOCAL_TASK, task_of(dst) or LOCAL_TASK
        if a != b:
            totals[(a, b)] += count
    return dict(totals)


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


def summary(entries: Sequence[dict]) -> str:
    """The end-of-run report: ops per device, traffic, expectation, strays."""
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
        lines += reason_lines(step_ops, info["towers"])
        lines += memory_lines(entries, step)
        from engine.placement import analysis

        found = analysis.analyse(entries, step)
        if found is not None:
            lines += analysis.lines(found)
    return "\n".join(lines)


def wanted_device(owner, requested: str | None, towers: Sequence[str]) -> str | None:
    """Where an op is wanted: its tower's device for a tower's op (whatever
    it asked for: a colocation sets the request), else the device it asked
    for."""
    if isinstance(owner, int) and owner < len(towers):
        return towers[owner]
    return requested


# What engine.placement.reasons.reason says of an op colocated with a
# variable (parsed here: reading a log needs no TensorFlow).
_COLOCATED = re.compile(r"^colocated with variable (\S+) on (\S+) \((.*)\)$")
# Up to _SEPARATE variables get a line each; past that, one line names
# _NAMED of them (the log keeps every op's reason: `tower-placement` reads it).
_SEPARATE, _NAMED = 8, 3


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
            lines += [f"    {n} ({(ops_a if label == 'A' else ops_b)[n]['assigned']})" for n in sorted(only)]
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
