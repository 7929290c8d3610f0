"""Why a step took as long as it did: busy and idle time per device, what
each device waited for, the critical path, and the longest ops.

Works on a placement log with timings (engine.placement.timeline). The step
is a DAG: an op waits for its `inputs`; an input that is a `_Recv` waits for
the transfer's `_Send`, which waits for the op that made the tensor. A node
that runs several times (inside a loop) is taken at its first run.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from engine.placement import report
from engine.placement.overlap import Overlap, busy, overlap

# Gaps shorter than this are the executor's own scheduling, not waiting.
_GAP_US = 1.0


@dataclasses.dataclass(frozen=True)
class Link:
    """One element of the critical path: an op, or a transfer's send.

    Attributes:
      name: the node's name in the partitioned graph.
      op: its op type (`_Send` for a transfer).
      device: where it ran.
      start_us, dur_us: its first run, from the start of the call.
      transfer: `src -> dst, N bytes` for a send, else None.
    """

    name: str
    op: str
    device: str
    start_us: float
    dur_us: float
    transfer: str | None = None  # "src -> dst, N bytes" for a send


@dataclasses.dataclass(frozen=True)
class DeviceTime:
    """How one device spent the step.

    Attributes:
      device: the device.
      busy_us: the union of its ops' slices.
      idle_us: the rest of the call's wall time.
      waited: what its idle gaps waited for (a cause in words) -> microseconds.
      longest: its longest slice records, longest first.
    """

    device: str
    busy_us: float
    idle_us: float
    waited: dict[str, float]  # cause -> microseconds idle before the op it held up
    longest: list[dict]  # the longest slices, longest first


@dataclasses.dataclass(frozen=True)
class Analysis:
    """Why one profiled step took as long as it did.

    Attributes:
      step: `train` or `eval`.
      wall_us: the call's wall time.
      devices: how each device spent it.
      critical_path: the chain of ops and sends that set its length, first
        to last.
      steps: the steps the call ran (several with `steps_per_loop`; the
        critical path follows the first).
      overlap: how much of the reduction ran while backward still did
        (engine.placement.overlap).
    """

    step: str
    wall_us: float
    devices: list[DeviceTime]
    critical_path: list[Link]
    steps: int = 1
    overlap: Overlap | None = None


class _Graph:
    """First runs of nodes, and what each waits for."""

    def __init__(self, entries: Sequence[dict], step: str):
        self.first: dict[str, dict] = {}
        for s in report.slices(entries, step):
            self.first.setdefault(s["name"], s)
        self.inputs = {o["name"]: o["inputs"] for o in report.ops(entries, step)}
        self.by_recv = {t["recv"]: t for t in report.transfers(entries, step) if t.get("recv")}
        self.by_send = {t["send"]: t for t in report.transfers(entries, step)}
        self._untimed: dict[str, list[str]] = {}

    def producers(self, name: str) -> list[str]:
        """The timed nodes `name` waits for, looking through untimed ones (the
        executor runs constants, Identity and Switch nodes inline, unprofiled)."""
        if name in self.by_send:  # a send waits for its tensor's op
            sources = [self.by_send[name]["tensor"].split(":")[0]]
        else:
            sources = self.inputs.get(name, [])
        out: list[str] = []
        for source in sources:
            out += self._timed(source, set())
        return list(dict.fromkeys(out))

    def _timed(self, name: str, seen: set[str]) -> list[str]:
        if name in self.by_recv:
            name = self.by_recv[name]["send"]
        if name in self.first:
            return [name]
        if name in seen:
            return []
        seen.add(name)
        found = self._untimed.get(name)
        if found is None:
            if name in self.by_send:  # an untimed send: through to its tensor's op
                sources = [self.by_send[name]["tensor"].split(":")[0]]
            else:
                sources = self.inputs.get(name, [])
            found = [t for source in sources for t in self._timed(source, seen)]
            self._untimed[name] = found
        return found

    def end(self, name: str) -> float:
        s = self.first[name]
        return s["start_us"] + s["dur_us"]

    def handed_over(self, name: str) -> float:
        """When a node's result was there for the ops that wait for it: its
        end, or for a send its start (a send's slice can last until the
        receiver has taken the tensor, past the receiver's start)."""
        s = self.first[name]
        return s["start_us"] if name in self.by_send else s["start_us"] + s["dur_us"]


def _cause(graph: _Graph, name: str, device: str) -> str:
    """What the op `name` waited for: its input that finished last."""
    inputs = graph.producers(name)
    if not inputs:
        return "no input (the executor's scheduling)"
    last = max(inputs, key=graph.end)
    if last in graph.by_send:
        t = graph.by_send[last]
        return f"a transfer from {t['src']}" if t["dst"] == device else f"a send to {t['dst']}"
    producer = graph.first[last]
    if producer["phase"] == "input":
        return "input"
    if producer["device"] != device:
        return f"another device ({producer['device']})"
    return f"its own {producer['phase']} ops"


def analyse(entries: Sequence[dict], step: str = "train", top: int = 10) -> Analysis | None:
    """The step analysis of `step`, or None when the log has no timings for it."""
    call = report.call(entries, step)
    if call is None:
        return None
    graph = _Graph(entries, step)
    by_device: dict[str, list[dict]] = collections.defaultdict(list)
    for s in report.slices(entries, step):
        by_device[s["device"]].append(s)
    devices = []
    for device in sorted(by_device):
        slices = by_device[device]
        merged = busy([(s["start_us"], s["start_us"] + s["dur_us"]) for s in slices])
        busy_us = sum(b - a for a, b in merged)
        waited: dict[str, float] = collections.defaultdict(float)
        starts = {}
        for s in slices:
            starts.setdefault(s["start_us"], s)
        previous_end = None
        for start, end in merged:
            if previous_end is None:
                waited["the call's start (launching the function)"] += start
            elif start - previous_end > _GAP_US:
                waited[_cause(graph, starts[start]["name"], device)] += start - previous_end
            previous_end = end
        if previous_end is not None and call["dur_us"] - previous_end > _GAP_US:
            waited["the call's end (other devices' work)"] += call["dur_us"] - previous_end
        longest = sorted(slices, key=lambda s: -s["dur_us"])[:top]
        devices.append(DeviceTime(device, busy_us, max(call["dur_us"] - busy_us, 0.0),
                                  dict(waited), longest))
    return Analysis(step, call["dur_us"], devices, critical_path(graph), call.get("steps", 1),
                    overlap(report.slices(entries, step)))


def critical_path(graph: _Graph) -> list[Link]:
    """The chain of ops and transfers that set the step's length.

    From the op that ended last, back through the input handed over last,
    until a node that waited for no timed input. Devices run several ops at
    once (an inter-op thread pool; streams on GPUs), so a gap before a node
    is not blamed on the op before it on its device: the step analysis's
    idle time shows such gaps.
    """
    ops = [name for name in graph.first if name not in graph.by_send]
    if not ops:
        return []
    current = max(ops, key=graph.end)
    path, seen = [], set()
    while current is not None and current not in seen:
        seen.add(current)
        path.append(_link(graph, current))
        start = graph.first[current]["start_us"]
        # Inputs handed over before it started (a node that ran several
        # times is taken at its first run, which may come after).
        ready = [p for p in graph.producers(current)
                 if graph.handed_over(p) <= start + _GAP_US]
        current = max(ready, key=graph.handed_over, default=None)
    return list(reversed(path))


def _link(graph: _Graph, name: str) -> Link:
    s = graph.first[name]
    transfer = None
    if name in graph.by_send:
        t = graph.by_send[name]
        size = f"{t['bytes']:,} bytes" if t["bytes"] is not None else "unknown bytes"
        transfer = f"{t['src']} -> {t['dst']}, {size}"
    return Link(name, s["op"], s["device"], s["start_us"], s["dur_us"], transfer)


def lines(analysis: Analysis) -> list[str]:
    """The analysis as summary lines."""
    steps = f"{analysis.steps} steps" if analysis.steps > 1 else "step"
    out = [f"  step analysis (one profiled {analysis.step} call, {steps}, "
           f"{analysis.wall_us / 1000:.2f} ms wall):"]
    for d in analysis.devices:
        waits = ", ".join(f"{cause} {us / 1000:.2f} ms"
                          for cause, us in sorted(d.waited.items(), key=lambda kv: -kv[1])
                          if us >= 5.0)
        out.append(f"    {d.device}: busy {d.busy_us / 1000:.2f} ms, idle {d.idle_us / 1000:.2f} ms"
                   + (f"; waited for {waits}" if waits else ""))
    hidden = analysis.overlap
    if hidden is not None and hidden.reduce_us and hidden.backward_end_us:  # a train step
        out.append(f"  reduction: busy {hidden.reduce_us / 1000:.2f} ms, "
                   f"{100 * hidden.hidden_fraction:.0f}% of it while backward ran "
                   f"(hidden behind it); first reduction op at "
                   f"{hidden.first_reduce_us / 1000:.2f} ms, backward ended at "
                   f"{hidden.backward_end_us / 1000:.2f} ms")
    path = analysis.critical_path
    per_device: dict[str, float] = collections.defaultdict(float)
    for link in path:
        per_device[link.device] += link.dur_us
    spread = ", ".join(f"{d} {us / 1000:.2f} ms" for d, us in sorted(per_device.items()))
    if path:
        out.append(f"  critical path: {len(path)} ops and transfers, {spread}; the longest on it:")
    for link in sorted(path, key=lambda link: -link.dur_us)[:10]:
        what = f"send {link.transfer}" if link.transfer else link.op
        out.append(f"    {link.device}  {link.dur_us / 1000:8.3f} ms  {link.name} ({what})")
    out.append("  longest ops per device:")
    for d in analysis.devices:
        out.append(f"    {d.device}:")
        out += [f"      {s['dur_us'] / 1000:8.3f} ms  {s['name']} ({s['op']})" for s in d.longest]
    return out
