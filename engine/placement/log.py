"""Runtime placement of a step: where every op ran and what crossed devices.

TensorFlow's partitioned graphs say where each op was really placed; the
pre-optimization graph says where it was asked to go. Both come from run
metadata collected around one call of a `tf.function`
(`context.enable_run_metadata()`, call, `export_run_metadata()`); other calls
run without it. Cross-device edges appear as `_Send`/`_Recv` (or
`_HostSend`/`_HostRecv`) pairs; a `_Send` carries no shape, so the sent tensor
(`name:port`) is looked up in the concrete function's graph.

Log schema (JSON Lines), one object per line:

    {"kind": "run", "towers": [device, ...], "reduce_device": str,
     "parameter_bytes": int, "parameters": int, "batch_size": int,
     "reducer": str, "variables": "reduce-device"|"replicated",
     "compress": "fp16"|"bf16"|null, "model": str,
     "reducer_choices": [[smallest bytes, largest bytes, reducer], ...]}
    {"kind": "op", "step": "train"|"eval", "name": str, "op": str,
     "requested": str|null, "assigned": str, "tower": int|"input"|"reduce"|"other",
     "input_tower": int|null, "stray": str|null, "inputs": [node name],
     "reason": str|null}
    {"kind": "transfer", "step": "train"|"eval", "tensor": "name:port",
     "src": str, "dst": str, "dtype": str, "shape": [int]|null,
     "bytes": int|null, "via": "_Send"|"_HostSend", "control": bool,
     "send": node name, "recv": node name|null, "reason": str|null}

A control transfer is a cross-device control edge: an ordering signal that
carries no data (bytes 0). An op's `inputs` are the nodes it waits for
(data and control); a `_Recv` among them is the `recv` of a transfer.
`reason` says why an op ran elsewhere than it asked for (or than its tower's
device, when it asked for none): engine.placement.reasons.
With timings (engine.placement.timeline), the next call of each captured
step adds `call`, `slice` and `memory` records.
Devices are written short: `/cpu:1` when local, `/job:worker/task:1/cpu:0` on
another task (see engine.topology.devices.canonical); `bytes` is
per call of the step and null when the size cannot be known (never 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import op_def_registry

from engine import scopes
from engine.errors import RunError
from engine.placement import reasons, report, shapes
from engine.topology.devices import canonical

SENDS = ("_Send", "_HostSend")
RECVS = ("_Recv", "_HostRecv")
# Ops TensorFlow adds to hold a function's arguments and results: they go
# wherever their tensors are.
PLUMBING = ("_Arg", "_Retval", "NoOp", "Identity", "IdentityN")


class StrayPlacementError(RunError):
    """`strict_placement`: tower ops ran outside their tower's device."""


def short_device(name: str) -> str:
    """`/cpu:1` for a local device name, the name itself otherwise."""
    return canonical(name) or name


def collect(function: Callable, *args):
    """Calls `function(*args)` once with run metadata on.

    A `tf.function` is traced first, with run metadata still off: eager ops
    that run while tracing would otherwise add graphs of their own. TensorFlow
    partitions the function when it first runs it, so the partitioned graphs
    are still in the metadata of this call.

    Returns:
      (result, RunMetadata).
    """
    if hasattr(function, "get_concrete_function"):
        function.get_concrete_function(*args)
    context.enable_run_metadata()
    try:
        # Drop graphs TensorFlow kept from earlier eager work (creating
        # variables, for one): only this call's graphs go in the log.
        context.export_run_metadata()
        result = function(*args)
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    return result, metadata


def _takes_resource(op_type: str) -> bool:
    """True for ops that read or write a resource: they run where it lives."""
    op_def = op_def_registry.get(op_type)
    return bool(op_def) and any(
        arg.type == tf.resource.as_datatype_enum for arg in op_def.input_arg
    )


def records(
    metadata,
    step: str,
    towers: Sequence[str],
    graph: tf.Graph | None = None,
) -> list[dict]:
    """Op and transfer records of one captured call.

    Args:
      metadata: RunMetadata from `collect`.
      step: `train` or `eval`, written into every record.
      towers: the towers' devices (short names), by tower index.
      graph: the concrete function's graph, to find the shapes of sent tensors.
    """
    out = []
    for function_graph in metadata.function_graphs:
        pre = function_graph.pre_optimization_graph
        requested = {node.name: node.device for node in pre.node}
        facts = reasons.GraphFacts(pre, graph)
        optimized = {node.name: node for node in function_graph.post_optimization_graph.node}
        recvs = {
            _rendezvous(node): node.name
            for partition in function_graph.partition_graphs
            for node in partition.node if node.op in RECVS
        }
        for partition in function_graph.partition_graphs:
            # Partitioning adds nodes of its own (lowered control flow); the
            # nodes it keeps are better read in the optimized graph, where a
            # cross-device input is still the op, not a _Recv.
            for node in partition.node:
                optimized.setdefault(node.name, node)
            ops_by_name = {node.name: node.op for node in partition.node}
            for node in partition.node:
                if node.op in RECVS:
                    continue
                if node.op in SENDS:
                    record = _transfer(node, step, graph, ops_by_name, optimized)
                    record["recv"] = recvs.get(_rendezvous(node))
                else:
                    record = _op(node, step, requested.get(node.name) or None, towers, facts)
                out.append(record)
    return out


def _rendezvous(node) -> tuple[str, ...]:
    """The key a _Send and its _Recv share."""
    return tuple(node.attr[k].s.decode() for k in ("tensor_name", "send_device", "recv_device"))


def node_inputs(node) -> list[str]:
    """Names of the nodes `node` waits for, data and control, in order."""
    return [name.lstrip("^").split(":")[0] for name in node.input]


def _transfer(node, step: str, graph, ops_by_name: dict[str, str], optimized) -> dict:
    dtype = tf.dtypes.as_dtype(node.attr["T"].type)
    tensor = node.input[0]
    source = tensor.split(":")[0]
    # Partitioning turns a control edge between devices into a send of a dummy
    # constant named .../ctrl/...: an ordering signal, no data.
    control = ops_by_name.get(source) == "Const" and "/ctrl/" in source
    shape = [] if control else shapes.static_shape(graph, tensor, optimized)
    return {
        "kind": "transfer",
        "step": step,
        "tensor": tensor if ":" in tensor else tensor + ":0",
        "src": short_device(node.attr["send_device"].s.decode()),
        "dst": short_device(node.attr["recv_device"].s.decode()),
        "dtype": dtype.name,
        "shape": shape,
        "bytes": 0 if control else shapes.byte_count(dtype, shape),
        "via": node.op,
        "control": control,
        "send": node.name,
        "reason": reasons.transfer_reason(node.op, dtype.name, short_device(
            node.attr["send_device"].s.decode())),
    }


def _op(node, step: str, requested: str | None, towers: Sequence[str],
        facts: reasons.GraphFacts) -> dict:
    assigned = short_device(node.device)
    wanted = short_device(requested) if requested else None
    if scopes.is_partition_node(node.name, node.op):
        owner = "other"  # carries a control edge; it belongs to no tower
    else:
        owner = scopes.owner(node.name)
    stray = None
    if node.op not in PLUMBING and not _takes_resource(node.op):
        if isinstance(owner, int) and owner < len(towers) and assigned != towers[owner]:
            stray = f"tower {owner} op ran on {assigned}, not on {towers[owner]}"
        elif wanted and canonical(wanted) and assigned != wanted:
            stray = f"asked for {wanted}, moved to {assigned} by soft placement"
    expected = report.wanted_device(owner, wanted, towers)
    reason = None
    if (expected and canonical(expected) and assigned != expected
            and node.op not in ("_Arg", "_Retval")):
        reason = reasons.reason(facts, node.name, assigned)
    return {
        "kind": "op",
        "step": step,
        "name": node.name,
        "op": node.op,
        "requested": wanted,
        "assigned": assigned,
        "tower": owner,
        "input_tower": None if owner == "other" else scopes.input_tower(node.name),
        "stray": stray,
        "inputs": node_inputs(node),
        "reason": reason,
    }


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What the summary needs to know about the run besides the graphs."""

    towers: tuple[str, ...]
    reduce_device: str
    parameters: int
    parameter_bytes: int
    batch_size: int
    model: str
    # Batches per tower per step (gradient accumulation).
    accumulate: int = 1
    reducer: str = "central"
    variables: str = "reduce-device"
    compress: str | None = None
    # A stateful reducer's own figure of the bytes a train step sends for it
    # (engine.reducers.stateful), and when they are sent, if not every step.
    reduction_bytes: int | None = None
    reduction_note: str = ""
    # reducer auto: (smallest bytes, largest bytes, choice) by size.
    reducer_choices: tuple = ()

    def record(self) -> dict:
        return {"kind": "run", **dataclasses.asdict(self), "towers": list(self.towers),
                "reducer_choices": [list(c) for c in self.reducer_choices]}


class TransferBudgetError(RunError):
    """`max_transfer_bytes`: the captured train step moved more."""


class PlacementLog:
    """Captures the first call of each step kind and writes the log.

    `call(kind, function, *args)` runs the step; the first call of each kind is
    captured, the second (with `timings`) runs under the profiler and adds its
    timings and memory (engine.placement.timeline), the rest run plainly. With
    `strict`, stray ops raise StrayPlacementError right after the captured
    call; with `max_transfer_bytes`, a train step that moves more raises
    TransferBudgetError. With no `path` the log is kept in memory only.
    """

    def __init__(self, path: str | None, info: RunInfo, *, strict: bool = False,
                 timings: bool = True, max_transfer_bytes: int | None = None):
        self.path = path
        self.info = info
        self.strict = strict
        self.timings = timings
        self.max_transfer_bytes = max_transfer_bytes
        self.entries: list[dict] = [info.record()]
        self.notes: list[str] = []  # what could not be recorded, and why
        # Per captured kind: its run metadata and node name -> device.
        self.metadata: dict = {}
        self._devices: dict[str, dict[str, str]] = {}
        self._functions: dict[str, Callable] = {}  # what each kind's capture ran
        self._timed: set[str] = set()

    def call(self, kind: str, function, *args):
        if kind in self._devices:
            # Timings join the captured graphs by node name: only a call of
            # the same function (not the loop of steps for one step) is timed.
            if self.timings and kind not in self._timed and function is self._functions[kind]:
                self._timed.add(kind)
                return self._time(kind, function, *args)
            return function(*args)
        result, metadata = collect(function, *args)
        if not metadata.function_graphs:
            raise ValueError(
                f"the {kind} step's function ran before this log saw it, and TensorFlow "
                "reports placement only on a tf.function's first call: log its first "
                "call (or a new tf.function)"
            )
        graph = function.get_concrete_function(*args).graph
        new = records(metadata, kind, self.info.towers, graph)
        self.entries.extend(new)
        self.metadata[kind] = metadata
        self._functions[kind] = function
        self._devices[kind] = {
            node.name: short_device(node.device)
            for function_graph in metadata.function_graphs
            for partition in function_graph.partition_graphs
            for node in partition.node
        }
        self.write()
        strays = [r for r in new if r["kind"] == "op" and r["stray"]]
        if self.strict and strays:
            raise StrayPlacementError(stray_message(strays))
        if kind == "train" and self.max_transfer_bytes is not None:
            from engine.placement import budgets

            over = budgets.violations(
                self.entries, budgets.Budget(max_total_bytes=self.max_transfer_bytes), kind
            )
            if over:
                raise TransferBudgetError(f"<max_transfer_bytes>: {over[0]}")
        return result

    def _time(self, kind: str, function, *args):
        from engine.placement import profile, timeline

        try:
            result, seen = profile.profile(function, *args)
        except profile.ProfilerBusy:
            note = (f"no timings for the {kind} step: another profiler was running "
                    "(<profile_steps> over its second call?)")
            self.notes.append(note)
            self.entries.append({"kind": "note", "step": kind, "text": note})
            self.write()
            return function(*args)
        if seen is None:
            self.notes.append(f"no timings for the {kind} step: the profiler recorded nothing")
            return result
        steps = int(result["steps"]) if isinstance(result, dict) and "steps" in result else 1
        self.entries.extend(timeline.records(seen, kind, self._devices[kind], steps))
        self.write()
        return result

    def write(self) -> None:
        """Writes every entry so far, replacing the file in one rename."""
        if self.path is None:
            return
        partial = self.path + ".partial"
        with open(partial, "w") as stream:
            for entry in self.entries:
                stream.write(json.dumps(entry) + "\n")
        os.replace(partial, self.path)


def stray_message(strays: Sequence[dict]) -> str:
    """One line naming the stray ops and where they ran."""
    shown = "; ".join(f"{r['name']} ({r['op']}): {r['stray']}" for r in strays[:5])
    more = f"; and {len(strays) - 5} more" if len(strays) > 5 else ""
    return (f"<strict_placement>: {len(strays)} stray op(s) in the {strays[0]['step']} step: "
            f"{shown}{more}")
