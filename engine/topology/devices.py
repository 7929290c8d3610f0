"""Tower devices: parse `devices`, split the host CPU, check what exists.

Parsing is pure string work and runs before TensorFlow is imported, so that a
bad spec fails fast and `cpu:N` can split the host CPU before TensorFlow
initialises its devices.
"""

from __future__ import annotations

import dataclasses
import os
import re

from engine.errors import UsageError

# Device names in any spelling TensorFlow accepts: /gpu:1, /device:GPU:1,
# /job:localhost/replica:0/task:0/device:GPU:1, /job:worker/task:1/device:CPU:0.
_NAME = re.compile(
    r"^(?:/job:(?P<job>[A-Za-z_][\w-]*)(?:/replica:0)?(?:/task:(?P<task>\d+))?)?"
    r"/(?:device:)?(?P<kind>cpu|gpu):(?P<ordinal>\d+)$",
    re.IGNORECASE,
)
# The short form of a worker's device: w1/gpu:0 is /job:worker/task:1/device:GPU:0.
_SHORT = re.compile(r"^w(?P<task>\d+)/(?P<kind>cpu|gpu):(?P<ordinal>\d+)$", re.IGNORECASE)
# Jobs whose task 0 is this process: `localhost` when it only connects to a
# cluster, `chief` when the cluster names it (TensorFlow's convention).
CLIENT = "localhost"
CHIEF = "chief"
LOCAL_JOBS = (CLIENT, CHIEF)
# `cpu:N` splits the host CPU, `gpu:N` GPU 0, into N logical devices.
_SPLIT = re.compile(r"^(?P<kind>cpu|gpu):(?P<count>-?\d+)$", re.IGNORECASE)
# Memory each logical GPU of `gpu:N` may take, unless told otherwise: enough
# for the model zoo at large batches, small enough for eight on any data-centre GPU.
DEFAULT_GPU_MEMORY_MB = 4096


class DeviceError(UsageError):
    """A device spec that cannot be honoured; the message is one line."""


@dataclasses.dataclass(frozen=True)
class DeviceRequest:
    """What the user asked for with `devices` and `reduce_device`.

    Attributes:
      towers: canonical device names (`/gpu:0`, `/cpu:1`,
        `/job:worker/task:1/gpu:0`), one per tower, or None for `all`.
      logical_cpus: split the host CPU into this many logical devices before
        TensorFlow initialises (`cpu:N`), or None to leave it whole.
      reduce_device: canonical name of the device that holds the variables and
        averages the gradients, or None for the default
        (`default_reduce_device`).
      logical_gpus: split GPU 0 into this many logical GPUs before TensorFlow
        initialises (`gpu:N`), or None to leave it whole.
      gpu_memory_mb: the memory limit of each logical GPU of `gpu:N`.
    """

    towers: tuple[str, ...] | None
    logical_cpus: int | None = None
    reduce_device: str | None = None
    logical_gpus: int | None = None
    gpu_memory_mb: int = DEFAULT_GPU_MEMORY_MB


@dataclasses.dataclass(frozen=True)
class Tower:
    """One tower: a device, and the data shard it reads.

    Attributes:
      index: position of the tower, also its DALI `shard_id`.
      device: canonical TensorFlow device name, e.g. `/gpu:1` or `/cpu:0`.
      num_towers: how many towers there are, also DALI's `num_shards`.
      physical_gpu: the CUDA device a logical GPU tower runs on, when it
        differs from the ordinal in its name (`gpu:N` makes N logical GPUs
        of GPU 0); None otherwise.
    """

    index: int
    device: str
    num_towers: int
    physical_gpu: int | None = None

    @property
    def gpu_index(self) -> int | None:
        """The CUDA device ordinal of a GPU tower (DALI's `device_id`), else None."""
        kind, ordinal = split_name(self.device)
        if kind != "gpu":
            return None
        return ordinal if self.physical_gpu is None else self.physical_gpu


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where everything runs: the towers, and the reduce device."""

    towers: tuple[Tower, ...]
    reduce_device: str

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(t.device for t in self.towers)

    @property
    def one_device(self) -> bool:
        """True when every tower is the reduce device (one tower, its
        variables on its own device): a step never leaves that device."""
        return set(self.devices) == {self.reduce_device}

    def shared_gpus(self) -> dict[int, list[str]]:
        """Physical GPUs that carry more than one tower: {CUDA ordinal: towers}.

        Only this process's GPUs are known; a worker's are taken as they are named.
        """
        by_gpu: dict[tuple[str | None, int], list[str]] = {}
        for tower in self.towers:
            if tower.gpu_index is not None:
                key = (task_of(tower.device), tower.gpu_index)
                by_gpu.setdefault(key, []).append(tower.device)
        return {gpu: names for (_, gpu), names in by_gpu.items() if len(names) > 1}

    def simulated(self) -> list[tuple[str, int]]:
        """(the physical device, how many towers share it) wherever several
        towers run on one: logical GPUs of one GPU (`gpu:N`) or CPUs of one
        task's processor (`cpu:N`). Each tower keeps its own data shard,
        gradient and reducer state, so they compute what as many devices
        would; only their time is shared."""
        groups: dict[str, int] = {}
        for tower in self.towers:
            task = task_of(tower.device)
            where = "this host's" if task is None else f"{task}'s"
            if tower.gpu_index is not None:
                physical = f"{where} GPU {tower.gpu_index}"
            elif split_name(tower.device)[0] == "cpu":
                physical = f"{where} CPU"
            else:
                continue
            groups[physical] = groups.get(physical, 0) + 1
        return [(physical, count) for physical, count in groups.items() if count > 1]


def canonical(name: str) -> str | None:
    """The canonical name of a device, None if `name` is not a device name.

    Local devices (this process's) are `/cpu:K` and `/gpu:K`; a device of
    another task is `/job:J/task:T/cpu:K` (accepted by `tf.device` as is).
    """
    text = name.strip()
    match = _SHORT.match(text)
    job = "worker" if match else None
    if not match:
        match = _NAME.match(text)
        if not match:
            return None
        job = match.group("job")
    device = f"{match.group('kind').lower()}:{int(match.group('ordinal'))}"
    task = int(match.group("task") or 0)
    if job is None or (job in LOCAL_JOBS and task == 0):
        return f"/{device}"
    return f"/job:{job}/task:{task}/{device}"


def split_name(name: str) -> tuple[str, int]:
    """(`cpu` or `gpu`, ordinal) of a canonical device name."""
    kind, ordinal = name.rsplit("/", 1)[1].split(":")
    return kind, int(ordinal)


def task_of(name: str) -> str | None:
    """`/job:J/task:T` of a canonical device name of another task, None if local."""
    head, _, _ = name.rpartition("/")
    return head or None


def parse_request(
    devices: str, reduce_device: str | None = None, gpu_memory_mb: int | None = None
) -> DeviceRequest:
    """Parses `devices`, `reduce_device` and `gpu_memory` without
    touching TensorFlow.

    Raises:
      DeviceError: for an empty spec, a malformed item, a duplicate, N < 1,
        or a memory limit without a GPU split.
    """
    request = _parse_towers(devices.strip(), reduce_device)
    if gpu_memory_mb is None:
        return request
    if request.logical_gpus is None:
        raise DeviceError(
            f"<gpu_memory={gpu_memory_mb}> sets the memory of each logical GPU of "
            "<devices=gpu:N>; add <devices=gpu:N> or drop <gpu_memory>"
        )
    if gpu_memory_mb < 1:
        raise DeviceError(f"<gpu_memory> ({gpu_memory_mb}) must be at least 1 (MiB)")
    return dataclasses.replace(request, gpu_memory_mb=gpu_memory_mb)


def _parse_towers(spec: str, reduce_device: str | None) -> DeviceRequest:
    reduce_name = None
    if reduce_device is not None:
        reduce_name = canonical(reduce_device)
        if reduce_name is None:
            raise DeviceError(
                f"<reduce_device> {reduce_device!r} is not a device name; "
                "use a name like /cpu:0, /gpu:1 or w1/gpu:0"
            )
    if not spec:
        raise DeviceError(
            "<devices> is empty; give GPU indices (0,1), 'all', 'cpu:N' "
            "or device names (/gpu:0,/cpu:0)"
        )
    if spec.lower() == "all":
        return DeviceRequest(towers=None, reduce_device=reduce_name)
    split = _SPLIT.match(spec)
    if split:
        kind, count = split.group("kind").lower(), int(split.group("count"))
        if count < 1:
            raise DeviceError(
                f"<devices> {spec!r}: N must be at least 1 for {kind}:N, got {count}"
            )
        towers = tuple(f"/{kind}:{k}" for k in range(count))
        key = "logical_cpus" if kind == "cpu" else "logical_gpus"
        return DeviceRequest(towers, reduce_device=reduce_name, **{key: count})

    towers = []
    for item in (part.strip() for part in spec.split(",")):
        if item.isdigit():
            name = f"/gpu:{int(item)}"
        else:
            name = canonical(item)
        if name is None and _SPLIT.match(item):
            raise DeviceError(
                f"<devices> {spec!r}: {item!r} splits a device into logical ones and "
                f"stands alone; give it once ({item!r}), or list devices by name "
                "(/cpu:0,/cpu:1)"
            )
        if name is None:
            raise DeviceError(
                f"<devices> {spec!r}: {item!r} is not a GPU index or a device "
                "name; use GPU indices (0,1), 'all', 'cpu:N' or names like /gpu:0 "
                "or w1/gpu:0 (task 1 of the cluster's workers)"
            )
        if name in towers:
            raise DeviceError(
                f"<devices> {spec!r}: {name} is listed twice; each device "
                "carries one tower"
            )
        towers.append(name)
    return DeviceRequest(tuple(towers), reduce_device=reduce_name)


def resolve(
    request: DeviceRequest, visible: list[str], physical: dict[str, int] | None = None
) -> Placement:
    """Checks a request against the devices that exist and fixes the towers.

    Args:
      request: the parsed request.
      visible: canonical names of the logical devices TensorFlow sees.
      physical: the CUDA ordinal of each local logical GPU whose name says
        otherwise (logical GPUs of a split GPU); see `logical_gpu_map`.

    Raises:
      DeviceError: naming the missing device and listing those that exist.
    """
    here = ", ".join(visible)
    gpus = [d for d in visible if split_name(d)[0] == "gpu"]
    names = request.towers
    if names is None:
        # With a cluster, `all` means the workers' devices: their GPUs, else
        # their CPUs; without one, this machine's.
        pool = [d for d in visible if task_of(d)] or visible
        names = tuple(d for d in pool if d in gpus) or tuple(
            d for d in pool if split_name(d)[0] == "cpu"
        )
    for name in names:
        if name not in visible:
            if task_of(name):
                hint = (f" (is {task_of(name)} in the cluster? tower-worker --cpus N "
                        "gives a worker N CPU devices)")
            else:
                hint = "" if gpus else " (no GPU here: use <devices=cpu:N> for N CPU towers)"
            what = f"GPU {split_name(name)[1]}" if name.startswith("/gpu:") else name
            raise DeviceError(
                f"<devices>: {what} does not exist; devices here: {here}{hint}"
            )
    reduce_device = request.reduce_device or default_reduce_device(names)
    if reduce_device not in visible:
        raise DeviceError(
            f"<reduce_device={reduce_device}> does not exist; devices here: {here}"
        )
    physical = physical or {}
    towers = tuple(
        Tower(i, name, len(names), physical.get(name)) for i, name in enumerate(names)
    )
    return Placement(towers=towers, reduce_device=reduce_device)


def default_reduce_device(towers: tuple[str, ...]) -> str:
    """Where the variables live unless the user says: on the first tower's
    GPU when every tower is a GPU of this process (weights and gradients then
    never cross the host, as tf_cnn_benchmarks' local parameter device `gpu`),
    else in host memory, `/cpu:0`, which every tower reaches alike."""
    if towers and all(name.startswith("/gpu:") for name in towers):
        return towers[0]
    return "/cpu:0"


def default_cpu_towers() -> int:
    """How many CPU towers `all` makes on a machine without GPUs: one per core."""
    return max(1, len(os.sched_getaffinity(0)))


def expected_tower_count(request: DeviceRequest) -> int:
    """How many towers a request will make, before TensorFlow starts."""
    if request.towers is not None:
        return len(request.towers)
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU")) or default_cpu_towers()
