"""A reduction's schedule: the DAG of its hops and its ops, read off a graph.

Every op of the graph is a task on its device; every tensor that one device
makes and another uses is a transfer task between them (once per tensor and
receiving device, as TensorFlow's partitioner sends it). A task waits for the
tasks that make its inputs, data and control. The cost model
(engine/cost/model.py) prices each task and walks the DAG.

The graph is the traced `tf.function` of the reduction, so a schedule can be
read for devices this machine does not have (the 8 GPUs of a topology file):
each op is on the device it asks for, and an op that asks for none runs with
its first input, as TensorFlow's placer puts it. The bytes per device that a
schedule sends are what the conformance kit's traffic check counts
(`Schedule.sent_per_device`; the kit checks that they equal the _Send ops of
the placed call).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf

from engine.topology.devices import canonical

__all__ = ["Schedule", "Task", "from_graph", "trace_reduction"]

# Ops whose output is their input's buffer (or a view of it): they cost the
# executor's fixed time per op, and no memory traffic. TensorFlow splits a
# buffer along its first dimension into aligned views, without copying, which
# is how split_even cuts the all-reduces' 1-D buffers.
ALIASES = frozenset({
    "Identity", "IdentityN", "Reshape", "ReadVariableOp", "Snapshot", "Squeeze",
    "ExpandDims", "StopGradient", "Split", "SplitV", "Unpack",
})
# Ops that do no work at run time of their own.
FREE = frozenset({"Placeholder", "Const", "NoOp", "VarHandleOp", "_Arg", "_Retval"})
# Tensors that are not data: a handle is never copied between devices.
_NOT_DATA = (tf.resource, tf.variant)


@dataclasses.dataclass(frozen=True)
class Task:
    """One node of a schedule.

    Attributes:
      name: the op's name; for a transfer, `tensor->device`.
      op: the op's type, or `transfer`.
      src: the device the op runs on, or that a transfer leaves.
      dst: the device a transfer reaches; `src` for an op.
      bytes: for an op, the bytes it reads and writes (0 for ops that only
        pass a buffer on, ALIASES); for a transfer, the bytes sent.
      after: indices of the tasks it waits for.
      writes: of an op's bytes, those it writes.
    """

    name: str
    op: str
    src: str
    dst: str
    bytes: int
    after: tuple[int, ...] = ()
    writes: int = 0

    @property
    def is_transfer(self) -> bool:
        return self.op == "transfer"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Tasks in an order in which each comes after the tasks it waits for.

    Attributes:
      tasks: the tasks, in that order.
    """

    tasks: tuple[Task, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device a task runs on or reaches, in order of first use."""
        seen = dict.fromkeys(d for t in self.tasks for d in (t.src, t.dst))
        return tuple(seen)

    @property
    def transfers(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.is_transfer)

    def sent_per_device(self) -> dict[str, int]:
        """Bytes each device sends, for the devices that send any."""
        sent: dict[str, int] = {}
        for t in self.transfers:
            if t.bytes:
                sent[t.src] = sent.get(t.src, 0) + t.bytes
        return sent

    def renamed(self, names: Mapping[str, str]) -> Schedule:
        """The same schedule with devices renamed (`/cpu:3` -> `/gpu:3`);
        devices not in `names` keep theirs.

        Args:
          names: old device name -> new.
        """
        return Schedule(tuple(
            dataclasses.replace(t, src=names.get(t.src, t.src), dst=names.get(t.dst, t.dst))
            for t in self.tasks
        ))


def _bytes(tensor: tf.Tensor) -> int:
    if tensor.dtype in _NOT_DATA or tensor.dtype == tf.string:
        return 0
    shape = tensor.shape
    if shape.rank is None or None in shape.as_list():
        raise ValueError(
            f"tensor {tensor.name} has shape {shape}: a schedule needs static "
            "shapes to know the bytes its ops move"
        )
    return shape.num_elements() * tensor.dtype.size


def from_graph(graph: tf.Graph) -> Schedule:
    """The schedule of every op of `graph` (a traced function's graph).

    Args:
      graph: the graph, e.g. `function.get_concrete_function().graph`; its
        ops carry the devices they ask for.

    Returns:
      The Schedule: a task per op that does work (not FREE), and a transfer
      for each data tensor that crosses devices (and a 0-byte one for a
      control edge that does); only what the function's results and its ops
      with effects need, as TensorFlow prunes the rest.

    Raises:
      ValueError: a tensor that crosses devices, or feeds an op, without a
        static shape.
    """
    device: dict[str, str | None] = {}
    tasks: list[Task] = []
    index: dict[str, int] = {}  # op name -> its task
    sent: dict[tuple[str, str], int] = {}  # (tensor or ^op, device) -> transfer task

    def arrival(name: str, key: str, source: str | None, target: str | None,
                size: int) -> int | None:
        """The task `target` waits for to have the output of op `name`."""
        made = index.get(name)
        if source is None or target is None or source == target:
            return made
        if (key, target) not in sent:
            sent[(key, target)] = len(tasks)
            tasks.append(Task(f"{key}->{target}", "transfer", source, target, size,
                              () if made is None else (made,)))
        return sent[(key, target)]

    for op in graph.get_operations():
        inputs = [t for t in op.inputs]
        mine = canonical(op.device) if op.device else None
        if mine is None:
            mine = next((device[t.op.name] for t in inputs if device.get(t.op.name)), None)
        device[op.name] = mine
        if op.type in FREE:
            continue
        after = []
        for t in inputs:
            if t.dtype in _NOT_DATA:  # a handle: the op runs where the resource is
                waited = index.get(t.op.name)
            else:
                waited = arrival(t.op.name, t.name, device[t.op.name], mine, _bytes(t))
            after.append(waited)
        for control in op.control_inputs:
            after.append(arrival(control.name, "^" + control.name, device.get(control.name),
                                 mine, 0))
        reads = writes = 0
        if op.type not in ALIASES:
            reads = sum(_bytes(t) for t in inputs)
            writes = sum(_bytes(t) for t in op.outputs)
        index[op.name] = len(tasks)
        where = mine or "?"
        tasks.append(Task(op.name, op.type, where, where, reads + writes,
                          tuple(sorted({a for a in after if a is not None})), writes))
    results = {t.op.name for t in graph.outputs}
    wanted = [index[op.name] for op in graph.get_operations() if op.name in index and (
        op._is_stateful or op.name in results)]
    return _pruned(tasks, wanted)


def _pruned(tasks: list[Task], wanted: Sequence[int]) -> Schedule:
    """The tasks that `wanted` (ops with effects, or the function's results)
    wait for, directly or not: TensorFlow runs no others."""
    keep = set()
    stack = list(wanted)
    while stack:
        i = stack.pop()
        if i not in keep:
            keep.add(i)
            stack.extend(tasks[i].after)
    order = sorted(keep)
    new = {old: k for k, old in enumerate(order)}
    return Schedule(tuple(
        dataclasses.replace(tasks[i], after=tuple(new[a] for a in tasks[i].after))
        for i in order
    ))


def reduction_body(reducer: Callable, devices: Sequence[str], destinations: Sequence[str]):
    """The body both timing and tracing run: `reducer` on `grads` (one list
    per device, made there), then on each destination the sum of its results
    (what keeps the reduction alive). Returns a function of grads to the
    sums, one scalar per destination, made there."""

    def body(grads):
        reduced = reducer(grads, list(devices), list(destinations))
        sums = []
        for destination, result in zip(destinations, reduced):
            with tf.device(destination):
                sums.append(tf.add_n([tf.reduce_sum(g) for g in result]))
        return sums

    return body


def trace_reduction(
    reducer: Callable, devices: Sequence[str], destinations: Sequence[str],
    sizes: Sequence[int], dtype: tf.DType = tf.float32,
) -> Schedule:
    """The schedule of one call of `reducer` on tensors of `sizes` elements,
    traced and not run, so `devices` need not exist here.

    Args:
      reducer: a stateless reducer (base.py's contract).
      devices: the towers' devices.
      destinations: where the mean is wanted.
      sizes: elements of each gradient, one tensor per size per tower.
      dtype: the gradients' dtype.

    Returns:
      The Schedule of the same body that `engine.reducers.measure` times.
    """
    body = reduction_body(reducer, devices, destinations)
    specs = [[tf.TensorSpec([n], dtype) for n in sizes] for _ in devices]

    @tf.function(autograph=False)
    def reduce_once(arguments):
        grads = []
        for device, tower in zip(devices, arguments):
            with tf.device(device):
                grads.append([tf.identity(t) for t in tower])
        return body(grads)

    return from_graph(reduce_once.get_concrete_function(specs).graph)
