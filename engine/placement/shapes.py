"""The shapes of the tensors a step sends between devices, and their bytes.

A `_Send` carries no shape, so the sent tensor (`name:port`) is looked up in
the traced graph: inside the branches and bodies that lowering inlined, and,
for nodes grappler made, through the optimized graph.
"""

from __future__ import annotations

import re

import tensorflow as tf

__all__ = ["byte_count", "find_op", "static_shape"]


# Element-wise ops: their output has the shape their inputs share. Grappler
# rewrites (an AddN that merges a chain of adds, say) create nodes that are not
# in the traced graph; their shape is read off their inputs.
ELEMENTWISE = ("AddN", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Cast", "Identity", "Neg")
# Ops that pass their first input on unchanged: the Switch that lowering a
# tf.cond puts in front of a branch's input (a gradient sent to the update
# inside the non-finite skip, when grappler dropped the mean of one tower),
# and the frames of a lowered while loop.
FORWARDS_FIRST_INPUT = ("Switch", "Enter", "Exit", "Snapshot", "StopGradient")


def static_shape(
    graph: tf.Graph | None, tensor: str, optimized: dict | None = None, depth: int = 8
) -> list[int] | None:
    """The fully known static shape of `tensor` (`name:port`), or None.

    Looked up in the traced graph; for a node grappler made, in the optimized
    graph `optimized` (name: node): a constant's own shape, or an element-wise
    op's through its inputs.
    """
    if graph is None:
        return None
    name, _, port = tensor.partition(":")
    try:
        shape = find_op(graph, name).outputs[int(port or 0)].shape
    except (KeyError, ValueError, IndexError):
        node = (optimized or {}).get(name)
        if node is not None and node.op == "Const":  # a constant grappler folded
            return [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
        if node is None or depth == 0:
            return None
        if node.op in FORWARDS_FIRST_INPUT:
            inputs = node.input[:1]
        elif node.op in ELEMENTWISE:
            inputs = [i for i in node.input if not i.startswith("^")]
        else:
            return None
        shapes = {
            tuple(s)
            for s in (static_shape(graph, i, optimized, depth - 1) for i in inputs)
            if s is not None
        }
        return list(shapes.pop()) if len(shapes) == 1 else None
    if shape.rank is None or None in shape.as_list():
        return None
    return shape.as_list()


# Lowering a tf.cond or tf.while_loop inlines its branches and body into the
# graph as `<op>/then/_<n>/<name in the branch's graph>`.
_INLINED = re.compile(r"^(.*?)/(then|else|cond|body)/_\d+/(.*)$")
_BRANCHES = {"then": "then_branch", "else": "else_branch", "cond": "cond", "body": "body"}


def find_op(graph: tf.Graph, name: str) -> tf.Operation:
    """The op `name` of `graph`, or of the branch or body of a control-flow op
    in it that lowering inlined; KeyError when there is none."""
    try:
        return graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        pass
    match = _INLINED.match(name)
    if not match:
        raise KeyError(name)
    owner, part, inner = match.groups()
    # The graph's function library; TensorFlow has no public way to read it.
    function = graph._get_function(find_op(graph, owner).get_attr(_BRANCHES[part]).name)
    if function is None:
        raise KeyError(name)
    return find_op(function.graph, inner)


def byte_count(dtype: tf.DType, shape: list[int] | None) -> int | None:
    """Bytes of a tensor of `dtype` and `shape`; None where they cannot be known."""
    if shape is None or dtype in (tf.resource, tf.variant, tf.string):
        return None
    count = 1
    for dim in shape:
        count *= dim
    return count * dtype.size
