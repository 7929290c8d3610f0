"""Why an op ran somewhere else than asked: the placer's reason, in words.

TensorFlow's placer does not record why it put a node where it did; the
reasons are read back from what it decides by:

* a node that reads or writes a resource runs where the resource lives
  (`colocated with variable dense/kernel on /cpu:0`);
* a colocation constraint (`tf.compat.v1.colocate_with`, TensorFlow's own
  `_class: loc:@...` attribute) puts a node with another;
* a device type with no kernel for the op and dtype (`no GPU kernel for
  Unique with T=string`) moves it to one that has one;
* a requested device that does not exist is dropped by soft placement;
* a node asked for no device goes where the placer finds room for it, next
  to its inputs.

On GPUs an int32 tensor of a GPU op is kept in host memory, and a transfer of
it is a `_HostSend`; `transfer_reason` says so. Logical CPU devices have one
kind of memory, and every op has a CPU kernel, so on them only colocation,
soft placement and unrequested placement occur.
"""

from __future__ import annotations

import functools

import tensorflow as tf
from tensorflow.python.framework import kernels

from engine.topology.devices import canonical

RESOURCE = tf.resource.as_datatype_enum


class GraphFacts:
    """What the reasons need from one captured function.

    Args:
      pre_optimization: the function's graph as traced (a GraphDef from run
        metadata): the requested devices and colocation attributes.
      graph: the traced `tf.Graph`, to name the variables its resource
        arguments hold; None when unknown.
    """

    def __init__(self, pre_optimization, graph: tf.Graph | None):
        self.nodes = {node.name: node for node in pre_optimization.node}
        self.variables: dict[str, str] = {}  # placeholder or _Arg name: variable
        if graph is None:
            return
        by_handle = {id(v.handle): v.name.split(":")[0] for v in graph.variables}
        captured = {
            internal.op.name: by_handle[id(external)]
            for external, internal in graph.captures
            if id(external) in by_handle
        }
        self.variables.update(captured)
        inputs = [t.op.name for t in graph.inputs]
        for node in pre_optimization.node:
            if node.op == "_Arg" and node.attr["T"].type == RESOURCE:
                index = node.attr["index"].i
                if index < len(inputs) and inputs[index] in captured:
                    self.variables[node.name] = captured[inputs[index]]

    def resource_of(self, name: str, depth: int = 4) -> str | None:
        """The variable (or resource node) that node `name` reads, if any."""
        node = self.nodes.get(name)
        if node is None or depth == 0:
            return None
        for source in node.input:
            source = source.lstrip("^").split(":")[0]
            if source in self.variables:
                return self.variables[source]
            producer = self.nodes.get(source)
            if producer is None:
                continue
            if producer.op in ("VarHandleOp", "_Arg") and _outputs_resource(producer):
                return source
            if producer.op in ("Identity", "Switch", "Enter"):
                found = self.resource_of(source, depth - 1)
                if found:
                    return found
        return None

    def colocated_with(self, name: str) -> str | None:
        """What node `name`'s colocation constraint names (`variable w` for
        a variable's handle), if it has one."""
        node = self.nodes.get(name)
        if node is None or "_class" not in node.attr:
            return None
        for entry in node.attr["_class"].list.s:
            target = entry.decode()
            if target.startswith("loc:@"):
                target = target[len("loc:@"):]
                if target in self.variables:
                    return f"variable {self.variables[target]}"
                return target
        return None


def _outputs_resource(node) -> bool:
    # `in` first: reading a missing key of a proto map would add it.
    return node.op == "VarHandleOp" or ("T" in node.attr and node.attr["T"].type == RESOURCE)


def reason(facts: GraphFacts, name: str, assigned: str) -> str:
    """Why node `name` ran on `assigned`, not where it was wanted (its
    tower's device, or the one it asked for).

    Args:
      facts: the captured function's graph facts.
      name: the node's name in the partitioned graph.
      assigned: the device it ran on (short name).
    """
    variable = facts.resource_of(name)
    if variable:  # engine.placement.report parses this one (_COLOCATED)
        return (f"colocated with variable {variable} on {assigned} (a resource's ops run "
                "where it lives)")
    target = facts.colocated_with(name)
    if target:
        return f"colocated with {target} on {assigned} (a colocation constraint)"
    node = facts.nodes.get(name)
    if node is None:
        return ("made by grappler's rewrites (not in the traced graph); TensorFlow placed it "
                "next to its inputs")
    requested = canonical(node.device) if node.device else None
    if requested is None:
        return ("no device requested (made outside the tower's tf.device scope); "
                "TensorFlow placed it next to its inputs")
    if requested == assigned:
        return f"asked for {requested} (a tf.device inside the tower's scope)"
    if requested not in _known_devices():
        return f"{requested} does not exist here; soft placement moved it"
    kind = _device_type(requested)
    dtype = _dtype(node)
    if not _has_kernel(node.op, kind, dtype):
        typed = f" with T={tf.dtypes.as_dtype(dtype).name}" if dtype else ""
        return f"no {kind} kernel for {node.op}{typed}; soft placement moved it"
    return "placed there by TensorFlow's placer (no recorded constraint explains it)"


def transfer_reason(via: str, dtype: str, src: str) -> str | None:
    """Why a transfer went through host memory, or None."""
    if via != "_HostSend":
        return None
    return (f"{dtype} tensor kept in host memory by a {src} kernel "
            "(GPU kernels take and give int32 in host memory)")


def _device_type(device: str) -> str:
    return tf.DeviceSpec.from_string(device).device_type or "CPU"


def _dtype(node) -> int | None:
    for key in ("T", "dtype", "SrcT"):
        if key in node.attr and node.attr[key].type:
            return node.attr[key].type
    return None


@functools.lru_cache(maxsize=None)
def _known_devices() -> frozenset[str]:
    return frozenset(canonical(d.name) for d in tf.config.list_logical_devices())


def _has_kernel(op: str, device_type: str, dtype: int | None) -> bool:
    """True when `op` has a kernel for `device_type` that admits `dtype`."""
    found = False
    for kernel in kernels.get_registered_kernels_for_op(op).kernel:
        if kernel.device_type != device_type:
            continue
        found = True
        if dtype is None:
            return True
        allowed = [c.allowed_values.list.type for c in kernel.constraint
                   if c.name in ("T", "dtype", "SrcT")]
        if not allowed or any(dtype in a for a in allowed):
            return True
    # An op type with no registered kernels at all (a function, a grappler
    # rewrite) has nothing to say about kernels.
    return not found and not kernels.get_registered_kernels_for_op(op).kernel
