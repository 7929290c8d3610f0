"""A captured step as a Chrome trace (trace event JSON), for Perfetto and
chrome://tracing.

One process per device; on it, one thread per part of the step that ran
there (tower k, input k, reduce, update, other). Every op is a complete
slice ("X") with its profiled start and duration; every data transfer is a
flow ("s" on the sending `_Send`, "f" on the first op that used the tensor on
the receiving device) named after its tensor, with its bytes; each device's
memory in use is a counter track ("C").
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from engine import scopes
from engine.errors import UsageError
from engine.placement import report


def _track(name: str) -> str:
    owner = scopes.owner(name)
    if isinstance(owner, int):
        return f"tower {owner}"
    tower = scopes.input_tower(name)
    if tower is not None:
        return f"input {tower}"
    phase = scopes.phase(name)
    return phase if phase in ("reduce", "update", "input") else "other"


def _track_order(track: str) -> tuple[int, int]:
    kind, _, index = track.partition(" ")
    order = {"tower": 0, "input": 1, "reduce": 2, "update": 3, "other": 4}[kind]
    return order, int(index) if index else 0


def chrome_trace(entries: Sequence[dict], step: str = "train") -> dict:
    """The trace of `step` as a JSON-ready dict (`{"traceEvents": [...]}`).

    Raises:
      UsageError: the log has no timings for `step`.
    """
    call = report.call(entries, step)
    if call is None:
        raise UsageError(f"the log has no timings for the {step} step; they come from its "
                         "second call: write the log with a run that calls it at least twice")
    slices = report.slices(entries, step)
    devices = sorted({s["device"] for s in slices}
                     | set(report.memory(entries, step)))
    pids = {device: i + 1 for i, device in enumerate(devices)}
    tracks: dict[str, set[str]] = collections.defaultdict(set)
    for s in slices:
        tracks[s["device"]].add(_track(s["name"]))
    tids = {
        (device, track): i + 1
        for device in devices
        for i, track in enumerate(sorted(tracks[device], key=_track_order))
    }
    events: list[dict] = []
    for device, pid in pids.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": device}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                       "args": {"sort_index": pid}})
    for (device, track), tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pids[device], "tid": tid,
                       "args": {"name": track}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pids[device],
                       "tid": tid, "args": {"sort_index": tid}})
    where: dict[str, tuple[int, int, float, float]] = {}
    for s in slices:
        pid, tid = pids[s["device"]], tids[(s["device"], _track(s["name"]))]
        where.setdefault(s["name"], (pid, tid, s["start_us"], s["dur_us"]))
        events.append({
            "ph": "X", "name": s["name"], "cat": s["op"], "pid": pid, "tid": tid,
            "ts": s["start_us"], "dur": s["dur_us"],
            "args": {"op": s["op"], "phase": s["phase"], "device": s["device"]},
        })
    events += _flows(entries, step, where)
    for record in report.memory(entries, step).values():
        pid = pids[record["device"]]
        events += [{"ph": "C", "name": "memory in use (bytes)", "pid": pid, "ts": t,
                    "args": {"bytes": n}} for t, n in record["samples"]]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"step": step, "wall_us": call["dur_us"],
                      "model": report.run_info(entries)["model"]},
    }


def _flows(entries, step, where) -> list[dict]:
    """A flow pair per data transfer: from its send to the first op that used it."""
    consumers: dict[str, list[str]] = collections.defaultdict(list)
    for o in report.ops(entries, step):
        for name in o["inputs"]:
            consumers[name].append(o["name"])
    out = []
    for i, t in enumerate(report.transfers(entries, step)):
        if t["control"] or t["send"] not in where:
            continue
        timed = _first_timed(consumers, t.get("recv"), where)
        if not timed:
            continue
        pid, tid, start, dur = where[t["send"]]
        to = min(timed, key=lambda w: w[2])
        label = {"tensor": t["tensor"], "bytes": t["bytes"], "src": t["src"], "dst": t["dst"]}
        name = f"{t['tensor']} ({t['bytes']:,} B)" if t["bytes"] is not None else t["tensor"]
        out.append({"ph": "s", "id": i + 1, "name": name, "cat": "transfer", "pid": pid,
                    "tid": tid, "ts": start + dur / 2, "args": label})
        out.append({"ph": "f", "bp": "e", "id": i + 1, "name": name, "cat": "transfer",
                    "pid": to[0], "tid": to[1], "ts": to[2], "args": label})
    return out


def _first_timed(consumers, name, where, depth: int = 4) -> list[tuple]:
    """Where the timed ops that use `name` ran, looking through untimed ones
    (an Identity, a control node) that pass it on."""
    found, frontier = [], [name]
    for _ in range(depth):
        following = []
        for node in frontier:
            for user in consumers.get(node, []):
                (found if user in where else following).append(user)
        if found:
            return [where[u] for u in found]
        frontier = following
    return []
