"""Name scopes of the step's ops, and who an op belongs to by its name.

The step puts tower k's forward pass under `tower_k/` (its backward pass then
gets `gradient_tape/tower_k/`), the fetch of tower k's batch under `input_k/`,
and the reduction and update under `reduce/` and `update/`. TensorFlow makes a
reused scope unique by appending `_1`, `_2`, ...; the owner ignores that.
"""

from __future__ import annotations

import re

REDUCE = "reduce"
UPDATE = "update"

_TOWER = re.compile(r"^(?:gradient_tape/)?tower_(\d+)(?:_\d+)?/")
_INPUT = re.compile(r"^input_(\d+)(?:_\d+)?/")
# The step functions take the towers' iterators as an argument named
# `iterators`; TensorFlow names the argument nodes iterators, iterators_1, ...
_ITERATOR_ARGS = re.compile(r"^iterators(?:_\d+)?$")
_REDUCE = re.compile(rf"^(?:gradient_tape/)?(?:{REDUCE}|{UPDATE})(?:_\d+)?/")


def tower_scope(index: int) -> str:
    return f"tower_{index}"


def input_scope(index: int) -> str:
    return f"input_{index}"


# An op inside a tf.cond branch, after TensorFlow lowers the cond, is named
# cond/then/_0/cond/<its own name>; the owner is read from its own name.
_BRANCH = re.compile(r"^(?:[\w.-]+/(?:then|else)/_\d+/[\w.-]+/)+")
# Nodes graph partitioning adds for a control edge between devices: a
# constant .../ctrl/_N on the sender and an Identity .../_N on the receiver.
_PARTITION = re.compile(r"/(?:ctrl/)?_\d+$")


def is_partition_node(name: str, op: str) -> bool:
    """True for the nodes partitioning adds to carry control edges."""
    return op in ("Const", "Identity") and bool(_PARTITION.search(name))


def owner(name: str) -> int | str:
    """Tower index, `input`, `reduce` or `other` for an op named `name`."""
    name = _BRANCH.sub("", name)
    match = _TOWER.match(name)
    if match:
        return int(match.group(1))
    if _INPUT.match(name) or _ITERATOR_ARGS.match(name):
        return "input"
    if _REDUCE.match(name):
        return "reduce"
    return "other"


def input_tower(name: str) -> int | None:
    """The tower whose batch an `input_k/` op fetches, else None."""
    match = _INPUT.match(_BRANCH.sub("", name))
    return int(match.group(1)) if match else None


# The parts of a step, in the order they run (`phase`).
PHASES = ("input", "forward", "backward", "reduce", "update", "other")


def phase(name: str) -> str:
    """The part of the step an op named `name` belongs to: `input` (fetching
    batches), `forward` and `backward` (a tower's passes), `reduce`, `update`
    or `other`."""
    name = _BRANCH.sub("", name)
    if _TOWER.match(name):
        return "backward" if name.startswith("gradient_tape/") else "forward"
    if _INPUT.match(name) or _ITERATOR_ARGS.match(name):
        return "input"
    match = _REDUCE.match(name)
    if match:
        own = match.group(0).removeprefix("gradient_tape/")
        return UPDATE if own.startswith(UPDATE) else REDUCE
    return "other"
