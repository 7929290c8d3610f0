"""Reading placement logs: the summary, the expected traffic, and diffs."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Sequence

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
    * `compress` halves the traffic of float32 gradients.
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


def strays(entries: Iterable[dict]) -> list[dict]:
    return [e for e in entries if e["kind"] == "op" and e["stray"]]


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


def wanted_device(owner, requested: str | None, towers: Sequence[str]) -> str | None:
    """Where an op is wanted: its tower's device for a tower's op (whatever
    it asked for: a colocation sets the request), else the device it asked
    for."""
    if isinstance(owner, int) and owner < len(towers):
        return towers[owner]
    return requested
