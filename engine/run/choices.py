"""What a run picks where the user left a setting open, and why.

The fastest known setting for the placement is the default: with GPU towers
the variables live on the first tower's GPU (tf_cnn_benchmarks'
local parameter device `gpu`), and a tower whose variables are on its own
device is compiled whole by XLA, as Keras' `fit(jit_compile=True)` compiles
its train step. CPU towers keep the settings measured fastest on CPUs: the
variables in host memory, TensorFlow's own (oneDNN) kernels rather than XLA.
Each choice carries the reason the run's header prints, with the argument
that overrides it as a marker (engine.errors).
"""

from __future__ import annotations

import dataclasses
import math
import os

from engine.topology.devices import Placement, task_of

__all__ = ["Choice", "dali_threads", "gpu_towers", "layout", "reduce_device", "steps_per_loop",
           "xla"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """A setting the run picked itself.

    Attributes:
      argument: the argument left open (`reduce_device`, `xla`, ...).
      value: what was picked.
      reason: why, for the header; names the way to choose otherwise.
    """

    argument: str
    value: object
    reason: str


def gpu_towers(placement: Placement) -> bool:
    """True when every tower is a GPU of this process."""
    return all(t.gpu_index is not None and not task_of(t.device) for t in placement.towers)


def reduce_device(placement: Placement) -> Choice:
    """Where the variables live when `reduce_device` was not given (the
    placement was resolved with `engine.topology.devices.default_reduce_device`)."""
    device = placement.reduce_device
    if device.startswith("/gpu:"):
        own = "the tower's own GPU" if placement.one_device else "the first tower's GPU"
        return Choice(
            argument="reduce_device", value=device,
            reason=f"variables on {device}, {own}: weights and gradients never cross "
                   "the host (<reduce_device=/cpu:0> keeps them in host memory)")
    return Choice(
        argument="reduce_device", value=device,
        reason=f"variables on {device}: host memory every tower reaches alike")


def xla(placement: Placement, deterministic: bool) -> Choice:
    """XLA on where it compiles the whole step on a GPU: one GPU tower whose
    variables live on it. Elsewhere off: CPU towers run faster on TensorFlow's
    own oneDNN kernels, and several towers keep their reduction visible."""
    if deterministic:
        return Choice(argument="xla", value=False,
                      reason="no XLA: <deterministic=True> needs TensorFlow's own kernels")
    on_gpu = gpu_towers(placement)
    if on_gpu and placement.one_device:
        return Choice(
            argument="xla", value=True,
            reason=f"XLA: the whole step (forward, backward, loss scale, update, "
                   f"metrics) is one compiled program on {placement.reduce_device}, "
                   "with no host round trip (<xla=False> turns it off)")
    why = ("CPU towers run faster on TensorFlow's own kernels" if not on_gpu else
           "the variables are not on the towers' device")
    return Choice(argument="xla", value=False,
                  reason=f"no XLA: {why} (<xla=True> turns it on)")


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0))


def threads_per_pipeline(towers: int, gpus: bool) -> int:
    """DALI threads per tower pipeline for `towers` towers on this host:
    half the cores over GPU towers, a quarter over CPU towers, at least 1."""
    return max(1, cores() // ((2 if gpus else 4) * towers))


def dali_threads(placement: Placement) -> Choice:
    """DALI worker threads per tower pipeline.

    A CPU tower's DALI threads compete with its TensorFlow ops for the same
    cores: a quarter of the cores per tower, at least one, lost least in
    the bench's DALI sweep (scripts/bench.py) on a 2-core host (1 thread: 0.76 of the
    in-memory speed against 0.59 with 2, mlp on 2 towers). A GPU tower's
    compute is on its GPU, and its pipeline decodes there: half the cores
    per tower feed the decoder, the other half dispatch TensorFlow's work.
    """
    n, host = len(placement.towers), cores()
    if gpu_towers(placement):
        threads = threads_per_pipeline(n, gpus=True)
        return Choice(argument="dali_threads", value=threads,
                      reason=f"DALI: {threads} threads per tower pipeline, half of "
                             f"this host's {host} cores over {n} GPU tower{'s' * (n > 1)}")
    threads = threads_per_pipeline(n, gpus=False)
    return Choice(argument="dali_threads", value=threads,
                  reason=f"DALI: {threads} thread{'s' * (threads > 1)} per tower "
                         f"pipeline, a quarter of this host's {host} cores over {n} "
                         f"tower{'s' * (n > 1)}, leaving the rest to the towers")


def layout(placement: Placement, compute_dtype: str, images: bool) -> Choice | None:
    """The image layout, named where it matters: float16 convolutions on GPUs
    run on tensor cores in channels-last (NHWC), the layout DALI produces and
    Keras' layers take, so no transpose is added."""
    if not (images and compute_dtype == "float16" and gpu_towers(placement)):
        return None
    return Choice(argument="layout", value="NHWC",
                  reason="layout: images channels-last (NHWC) from DALI to the "
                         "convolutions, the layout float16 tensor-core kernels take")


# Steps per call of the compiled step on GPU towers: ResNet-50 on one H200
# ran 1.07x Keras `fit(jit_compile=True)` at one step per call and 1.18x at
# 25 (docs: Benchmarks); past that the host's share is under a percent.
GPU_STEPS_PER_LOOP = 25


def steps_per_loop(gpus: bool, *, every: tuple[int, ...] = ()) -> Choice:
    """Steps per call of the compiled step when `steps_per_loop` was not given.

    GPU towers (`gpus`) run GPU_STEPS_PER_LOOP steps a call, or the largest
    count below it that divides each non-zero cadence in `every` (the
    checkpoint and replica-check intervals, which fall between calls). What
    a user sees is the same at any count (engine.core.loop reports every
    step). CPU towers run one step a call: the host is the device, and
    dispatching costs little beside a step there.
    """
    if not gpus:
        return Choice(argument="steps_per_loop", value=1,
                      reason="one step per call of the compiled step (CPU towers)")
    cadence = math.gcd(*every) if any(every) else 0
    count = max(k for k in range(1, GPU_STEPS_PER_LOOP + 1) if not cadence or cadence % k == 0)
    why = (f", a divisor of the checkpoint and replica-check interval {cadence}"
           if count < GPU_STEPS_PER_LOOP else "")
    return Choice(argument="steps_per_loop", value=count,
                  reason=f"{count} steps per call of the compiled step{why}: the host "
                         "dispatches and reads the loss, the non-finite flags and the loss "
                         "scale once per call; every step is still reported and guarded as "
                         "its own (<steps_per_loop=1> for one)")
