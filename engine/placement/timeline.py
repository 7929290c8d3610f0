"""A captured step's timings and memory, as placement log records.

The placement log captures the first call of each step kind for placement
(run metadata compiles and partitions the function on that call, so its
timings are not the step's); the next call of the same kind runs under the
profiler (engine.placement.profile), with the same partitioned graphs and
node names, and adds:

    {"kind": "call", "step": str, "dur_us": float, "steps": int}
    {"kind": "slice", "step": str, "name": node, "op": str, "device": str,
     "phase": str, "start_us": float, "dur_us": float, "thread": int}
    {"kind": "memory", "step": str, "device": str, "peak_bytes": int,
     "phases": {phase: peak bytes}, "samples": [[time_us, bytes in use], ...],
     "allocators": [name, ...]}

* `call`: the function's run, wall time, and the steps it ran (several with
  `steps_per_loop`); slices are timed from its start.
* `slice`: one execution of a node (a node in a loop runs several times).
* `memory`: bytes in use on the device by tensors allocated during the call,
  after each allocation and free; a phase's peak is the most in use when an
  op of that phase allocated. Tensors that outlive the call (variables, the
  iterators' buffers) were allocated before it and are not counted.
  `allocators` are the allocators that reported them: BFC allocators (every
  GPU's; the CPU's once engine.topology.process has chosen it) report every
  allocation; oneDNN's CPU allocator (`mklcpu`) only those of 256 KiB or
  more; TensorFlow's default CPU allocator none.

On GPUs, slices are the kernels and copies on the GPU's streams (the host
only launches them).
"""

from __future__ import annotations

import collections
import re

from engine import scopes
from engine.placement.profile import Profile


def records(profile: Profile, step: str, devices: dict[str, str], steps: int = 1) -> list[dict]:
    """Call, slice and memory records of one profiled call.

    Args:
      profile: what the profiler saw during the call.
      step: `train` or `eval`.
      devices: node name -> device (short name) of every node of the
        captured function's partitioned graphs.
      steps: how many steps the call ran (a loop of steps runs several).
    """
    start, end = profile.call_start_us, profile.call_end_us
    out: list[dict] = [{"kind": "call", "step": step, "dur_us": round(end - start, 3),
                        "steps": steps}]
    for s in sorted(profile.slices, key=lambda s: s.start_us):
        if s.name not in devices or not start <= s.start_us <= end:
            continue
        out.append({
            "kind": "slice", "step": step, "name": s.name, "op": s.op,
            "device": devices[s.name], "phase": scopes.phase(s.name),
            "start_us": round(s.start_us - start, 3),
            "dur_us": round(min(s.dur_us, end - s.start_us), 3), "thread": s.thread,
        })
    out += memory(profile, step, devices)
    return out


_GPU_ALLOCATOR = re.compile(r"^GPU_(\d+)_bfc$")


def _gpu_of(allocation) -> str | None:
    """`/gpu:1` for an allocation of GPU 1's allocator that no node of the
    step made (a received tensor's buffer); None otherwise. Only allocations
    made during the call are counted, and frees of earlier ones are not."""
    match = _GPU_ALLOCATOR.match(allocation.allocator)
    if not match or (allocation.bytes < 0 and allocation.op is None):
        return None
    return f"/gpu:{match.group(1)}"


def memory(profile: Profile, step: str, devices: dict[str, str]) -> list[dict]:
    """One `memory` record per device that allocated during the call."""
    start = profile.call_start_us
    in_use: dict[str, int] = collections.defaultdict(int)
    peaks: dict[str, int] = collections.defaultdict(int)
    phases: dict[str, dict[str, int]] = collections.defaultdict(dict)
    samples: dict[str, list[list[float]]] = collections.defaultdict(list)
    allocators: dict[str, set[str]] = collections.defaultdict(set)
    for allocation in profile.allocations:
        device = devices.get(allocation.op or "") or _gpu_of(allocation)
        if device is None:
            continue  # made before the call, or by no node of this function
        allocators[device].add(allocation.allocator)
        in_use[device] += allocation.bytes
        now = in_use[device]
        samples[device].append([round(allocation.time_us - start, 3), now])
        peaks[device] = max(peaks[device], now)
        if allocation.bytes > 0:
            phase = scopes.phase(allocation.op or "")
            phases[device][phase] = max(phases[device].get(phase, 0), now)
    return [
        {"kind": "memory", "step": step, "device": device, "peak_bytes": peaks[device],
         "phases": phases[device], "samples": samples[device],
         "allocators": sorted(allocators[device])}
        for device in sorted(samples)
    ]
