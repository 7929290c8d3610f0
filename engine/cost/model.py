"""Predicted time of a schedule on a topology: alpha-beta-gamma costs, shared fairly.

Each task costs what it would take alone: an op `op_seconds` plus what its
device takes to read and write its bytes (`Device.seconds`), a transfer
`alpha + beta x bytes` on its link. A task starts
when the tasks it waits for are done, and runs at a rate of at most 1; tasks
that run at once share what they use, max-min fairly (the rate a bottleneck
gives each of its tasks is its capacity over their number):

* the CPU devices of one host share its `cores` (so do transfers between
  them, which are the host's memory copies and rendezvous);
* a GPU runs one op at a time at full speed;
* a link carries one transfer at full speed, and so does each `shared`
  resource its transfers pass through (a NIC, a PCIe switch).

The predicted time of one call is the host's fixed cost of a call (and of
each device the call runs on) plus the time the last task ends. The model
leaves out what the costs do not show: launch queues and stream ordering on
GPUs, NCCL's own kernels, protocol switches inside a link (eager and
rendezvous sizes), memory a copy allocates, and anything one op does to
another's cache.
"""

from __future__ import annotations

import dataclasses
import heapq

from engine.cost.schedule import Schedule
from engine.cost.topology import Topology, TopologyError

__all__ = ["Prediction", "predict"]


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What `predict` says about one call.

    Attributes:
      seconds: the predicted time of one call.
      fixed_seconds: of which the fixed cost of calling (host and devices).
      critical_path: names of the tasks on the path that ends last, in order.
      busy: seconds of work each resource had (its tasks' times alone, over
        its capacity), busiest first.
    """

    seconds: float
    fixed_seconds: float
    critical_path: tuple[str, ...]
    busy: tuple[tuple[str, float], ...]


def _costs(schedule: Schedule, topology: Topology):
    """(work seconds alone, resources used) per task, and each resource's capacity."""
    devices = topology.devices
    capacity: dict[str, float] = {}
    hosts = {}
    for host in topology.hosts:
        capacity[f"host:{host.name}"] = host.cores
        for device in host.devices:
            hosts[device.name] = host.name
    work, uses = [], []
    for task in schedule.tasks:
        for name in {task.src, task.dst}:
            if name not in devices:
                raise TopologyError(
                    f"topology {topology.name!r} has no device {name}; the schedule runs on "
                    f"{', '.join(schedule.devices)}"
                )
        if task.is_transfer:
            link = topology.link(task.src, task.dst)
            work.append(link.seconds(task.bytes))
            own = f"link:{task.src}->{task.dst}"
            capacity.setdefault(own, 1.0)
            for shared in link.shared:
                capacity.setdefault(shared, 1.0)
            uses.append((own, *link.shared))
        else:
            device = devices[task.src]
            work.append(device.op_seconds + device.seconds(task.bytes - task.writes,
                                                           task.writes))
            if device.kind == "cpu":
                uses.append((f"host:{hosts[task.src]}",))
            else:
                capacity.setdefault(f"device:{task.src}", 1.0)
                uses.append((f"device:{task.src}",))
    return work, uses, capacity


def _rates(active: list[int], uses, capacity) -> dict[int, float]:
    """Max-min fair rates (each at most 1) of the `active` tasks."""
    rates: dict[int, float] = {}
    left = dict(capacity)
    users: dict[str, set[int]] = {}
    for i in active:
        for r in uses[i]:
            users.setdefault(r, set()).add(i)
    unfixed = set(active)
    while unfixed:
        share, bottleneck = 1.0, None
        for r, tasks in users.items():
            if tasks:
                s = left[r] / len(tasks)
                if s < share:
                    share, bottleneck = s, r
        fixed = list(unfixed if bottleneck is None else users[bottleneck])
        for i in fixed:
            rates[i] = share
            unfixed.discard(i)
            for r in uses[i]:
                users[r].discard(i)
                left[r] -= share
    return rates


def predict(schedule: Schedule, topology: Topology) -> Prediction:
    """The predicted time of one call of `schedule` on `topology`.

    Args:
      schedule: from engine.cost.schedule (its devices named as the topology's).
      topology: the costs.

    Returns:
      A Prediction.

    Raises:
      TopologyError: a device of the schedule, or a link between two of its
        devices, that the topology lacks.
    """
    work, uses, capacity = _costs(schedule, topology)
    n = len(schedule.tasks)
    waiting = [len(t.after) for t in schedule.tasks]
    children: list[list[int]] = [[] for _ in range(n)]
    for i, task in enumerate(schedule.tasks):
        for j in task.after:
            children[j].append(i)
    finish = [0.0] * n
    last_input = [-1] * n
    remaining = list(work)
    active: list[int] = [i for i in range(n) if not waiting[i]]
    now = 0.0
    done = 0
    while active:
        rates = _rates(active, uses, capacity)
        step = min(remaining[i] / rates[i] for i in active)
        now += step
        still, ended = [], []
        for i in active:
            remaining[i] -= rates[i] * step
            (ended if remaining[i] <= 1e-15 * max(1.0, work[i]) else still).append(i)
        heap = list(ended)
        heapq.heapify(heap)
        while heap:  # tasks that end now, and the zero-cost ones they release
            i = heapq.heappop(heap)
            finish[i] = now
            done += 1
            for c in children[i]:
                waiting[c] -= 1
                if last_input[c] < 0 or finish[i] >= finish[last_input[c]]:
                    last_input[c] = i
                if not waiting[c]:
                    if work[c] <= 0:
                        heapq.heappush(heap, c)
                    else:
                        still.append(c)
        active = still
    if done != n:
        raise ValueError("the schedule has a cycle")
    devices = schedule.devices
    first = topology.host_of(devices[0]) if devices else topology.hosts[0]
    fixed = first.call_seconds + sum(topology.host_of(d).partition_seconds for d in devices)
    path, i = [], max(range(n), key=finish.__getitem__) if n else -1
    while i >= 0:
        path.append(schedule.tasks[i].name)
        i = last_input[i]
    busy: dict[str, float] = {}
    for i in range(n):
        for r in uses[i]:
            busy[r] = busy.get(r, 0.0) + work[i] / capacity[r]
    return Prediction(
        seconds=fixed + (max(finish) if n else 0.0),
        fixed_seconds=fixed,
        critical_path=tuple(reversed(path)),
        busy=tuple(sorted(busy.items(), key=lambda kv: -kv[1])),
    )
