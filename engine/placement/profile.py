"""Timings and allocations of one call, from TensorFlow's profiler.

Run metadata gives where each op ran but not when; the profiler
(`tf.profiler.experimental`) records every executed CPU kernel as an event
named `<node name>:<op type>` on the thread that ran it, every GPU kernel and
copy on its stream with the op that ran it (`tf_op`), and every allocation and
free of TensorFlow's allocators as `MemoryAllocation` / `MemoryDeallocation`
events that name the op (`tf_op`), the address and the requested bytes. Both
are read from the XSpace file the profiler writes (sizes as requested, not as
rounded up by the allocator's bins); node names are those of
the partitioned graphs, so they join the placement log's records by name.

Logical CPU devices share one allocator, so an allocation is given to a
device through the op that made it (the placement log knows its device); a
free is matched to its allocation by address. A GPU's allocator is its own
(`GPU_1_bfc`), which places allocations no node made (a received tensor's
buffer, `SameWorkerRecvDone`).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import tempfile
from collections.abc import Callable

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

# Events that are the executor's or the runtime's own bookkeeping, not ops.
_NOT_OPS = ("ExecutorState", "ExecutorDone", "ThreadpoolListener", "MemoryAllocation",
            "MemoryDeallocation")


@dataclasses.dataclass(frozen=True)
class Slice:
    """One execution of a node: `name` and `op` as in the partitioned graph;
    times in microseconds from the start of the profile."""

    name: str
    op: str
    start_us: float
    dur_us: float
    thread: int


@dataclasses.dataclass(frozen=True)
class Allocation:
    """An allocation (`bytes` > 0, made by node `op`) or a free (`bytes` < 0,
    `op` of the matching allocation, or None when it was made before the
    profile started)."""

    time_us: float
    bytes: int
    op: str | None
    allocator: str = ""  # "mklcpu", "GPU_1_bfc", ...


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the profiler saw during one call."""

    slices: list[Slice]
    allocations: list[Allocation]
    call_start_us: float  # the function's run, from the runtime's own event
    call_end_us: float
    # Copies on the GPUs' streams by kind (MemcpyD2H, MemcpyH2D, MemcpyD2D, ...).
    copies: dict[str, int] = dataclasses.field(default_factory=dict)


class ProfilerBusy(RuntimeError):
    """Another profiler (`profile_steps`, a user's) is running."""


def profile(function: Callable, *args):
    """Calls `function(*args)` once under the profiler.

    Returns:
      (result, Profile), or (result, None) when the profiler wrote nothing.

    Raises:
      ProfilerBusy: a profiler is already running in this process.
    """
    with tempfile.TemporaryDirectory(prefix="tower-profile-") as logdir:
        try:
            tf.profiler.experimental.start(logdir)
        except tf.errors.AlreadyExistsError as err:
            raise ProfilerBusy(str(err)) from None
        try:
            result = function(*args)
            # GPU kernels may still be queued when the call returns: wait for
            # its results, so the profile holds all of them.
            for value in tf.nest.flatten(result):
                if isinstance(value, tf.Tensor):
                    value.numpy()
        finally:
            tf.profiler.experimental.stop()
        files = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
        if not files:  # the profiler saw nothing it could write
            return result, None
        space = xplane_pb2.XSpace()
        with open(files[0], "rb") as stream:
            space.ParseFromString(stream.read())
    slices, allocations, run = _read(space)
    if run is None:  # no function run seen: the span of the ops themselves
        run = (min((s.start_us for s in slices), default=0.0),
               max((s.start_us + s.dur_us for s in slices), default=0.0))
    return result, Profile(slices, allocations, *run, copies=gpu_copies(space))


def gpu_copies(space) -> dict[str, int]:
    """How many copies the GPUs' streams ran, by kind (`MemcpyD2H`: device to
    host, `MemcpyH2D`, `MemcpyD2D`, ...)."""
    counts: dict[str, int] = {}
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if line.name in DERIVED_LINES:
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if name.lower().startswith("memcpy"):
                    kind = name.split()[0]
                    counts[kind] = counts.get(kind, 0) + 1
    return counts


# Lines of a GPU plane that repeat the time of the kernels and copies below them.
DERIVED_LINES = ("XLA Modules", "XLA Ops", "TensorFlow Ops", "Steps", "TensorFlow Name Scope",
                  "Source code")


def _stat_value(stat, names: dict[int, str]):
    if stat.ref_value:
        return names.get(stat.ref_value)
    which = stat.WhichOneof("value")
    return getattr(stat, which) if which else None


# The runtime's event around a whole function call, on the calling thread.
_FUNCTION_RUN = "KernelAndDeviceFunc::Run"


def _read(space):
    """(slices, allocations, (start, end) of the longest function run or None)."""
    slices: list[Slice] = []
    run = None
    raw: list[tuple[float, str, dict]] = []
    for plane in space.planes:
        if plane.name.startswith("/device:GPU:"):
            slices += _gpu_slices(plane)
            continue
        if plane.name != "/host:CPU":
            continue
        events = {k: v.name for k, v in plane.event_metadata.items()}
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            base_us = line.timestamp_ns / 1000.0
            for event in line.events:
                name = events[event.metadata_id]
                start = base_us + event.offset_ps / 1e6
                if name == _FUNCTION_RUN:
                    end = start + event.duration_ps / 1e6
                    if run is None or end - start > run[1] - run[0]:
                        run = (start, end)
                    continue
                if name in ("MemoryAllocation", "MemoryDeallocation"):
                    stats = {stat_names[s.metadata_id]: _stat_value(s, stat_names)
                             for s in event.stats}
                    raw.append((start, name, stats))
                    continue
                node, sep, op = name.rpartition(":")
                if not sep or not node or name.startswith(_NOT_OPS) or " " in name:
                    continue
                slices.append(Slice(node, op, start, event.duration_ps / 1e6, line.id))
    return slices, _allocations(raw), run


def _gpu_slices(plane) -> list[Slice]:
    """A GPU's kernels and copies, by the op that ran them (`tf_op` stat: the
    node name and type). The host events of GPU ops are only their launches;
    these are the work itself, on the GPU's streams. Consecutive kernels of
    one op on one stream are one slice."""
    stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
    out: list[Slice] = []
    for line in plane.lines:
        base_us = line.timestamp_ns / 1000.0
        last: Slice | None = None
        for event in line.events:
            tf_op = next((_stat_value(s, stat_names) for s in event.stats
                          if stat_names.get(s.metadata_id) == "tf_op"), None)
            node, sep, op = (tf_op or "").rpartition(":")
            if not sep or not node:
                continue
            start = base_us + event.offset_ps / 1e6
            end = start + event.duration_ps / 1e6
            if last is not None and last.name == node:
                out[-1] = last = dataclasses.replace(last, dur_us=end - last.start_us)
                continue
            last = Slice(node, op, start, end - start, line.id)
            out.append(last)
    return out


def _allocations(raw) -> list[Allocation]:
    out = []
    owners: dict[int, tuple[str, int]] = {}
    for time_us, kind, stats in sorted(raw, key=lambda r: r[0]):
        addr = stats.get("addr")
        if kind == "MemoryAllocation":
            size = int(stats.get("requested_bytes") or stats.get("allocation_bytes") or 0)
            op = stats.get("tf_op") or None
            owners[addr] = (op, size)
            out.append(Allocation(time_us, size, op, stats.get("allocator_name") or ""))
        else:
            op, size = owners.pop(addr, (None, int(stats.get("requested_bytes") or 0)))
            out.append(Allocation(time_us, -size, op, stats.get("allocator_name") or ""))
    return out
