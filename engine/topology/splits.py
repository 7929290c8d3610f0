"""Splitting one physical device into logical ones, once per process (the
host CPU into `cpu:N` towers, GPU 0 into `gpu:N` towers), and `configure`:
the split, the cluster connected, the request resolved into a placement."""

from __future__ import annotations

from collections.abc import Callable

from engine.topology import devices
from engine.topology.devices import DeviceError, DeviceRequest, Placement

__all__ = ["configure", "logical_gpu_map", "split_gpu", "split_host_cpu"]


def logical_gpu_map(split: int, physical_gpus: int) -> dict[str, int]:
    """{logical GPU name: CUDA ordinal} when GPU 0 is split into `split`
    logical GPUs: TensorFlow numbers them first, then the other GPUs."""
    ordinals = [0] * split + list(range(1, physical_gpus))
    return {f"/gpu:{k}": ordinal for k, ordinal in enumerate(ordinals)}


def split_gpu(count: int, memory_mb: int) -> None:
    """Splits GPU 0 into `count` logical GPUs of `memory_mb` each, once per
    process, and hides the other GPUs: once a GPU is split, TensorFlow grows
    memory on none, and would take all of theirs."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")

    def split():
        if len(gpus) > 1:
            tf.config.set_visible_devices([*tf.config.list_physical_devices("CPU"), gpus[0]])
        wanted = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * count
        tf.config.set_logical_device_configuration(gpus[0], wanted)

    _split_once(split, "GPU", count, "GPU 0")


def split_host_cpu(count: int) -> None:
    """Splits the host CPU into `count` logical devices, once per process."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    _split_once(
        lambda: tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count
        ),
        "CPU", count, "the CPU",
    )


def _split_once(split: Callable[[], None], kind: str, count: int, what: str) -> None:
    """Runs `split`; TensorFlow refuses once it is initialised, which is fine
    when it already has `count` devices of `kind`, and a DeviceError if not."""
    import tensorflow as tf

    try:
        split()
    except RuntimeError as err:
        have = len(tf.config.list_logical_devices(kind))
        if have != count:
            raise DeviceError(
                f"cannot split {what} into {count} devices: TensorFlow is already "
                f"initialised with {have}; split once per process, before use"
            ) from err


def configure(request: DeviceRequest, connect: Callable[[], None] | None = None) -> Placement:
    """Splits the host CPU if asked, connects to a cluster if given, then
    resolves the request against the devices TensorFlow sees.

    Must run before anything initialises TensorFlow's devices when the request
    splits the CPU.

    Args:
      request: the parsed request.
      connect: connects this process to a cluster (engine.topology.cluster), making
        the workers' devices visible; `all` then means theirs.
    """
    import tensorflow as tf

    logical_cpus = request.logical_cpus
    gpus = tf.config.list_physical_devices("GPU")
    physical = {}
    if request.logical_gpus is not None:
        if not gpus:
            raise DeviceError(
                f"<devices=gpu:{request.logical_gpus}> splits GPU 0 into logical GPUs, "
                "but this machine has no GPU; use <devices=cpu:N> for N CPU towers"
            )
        split_gpu(request.logical_gpus, request.gpu_memory_mb)
        physical = logical_gpu_map(request.logical_gpus, 1)
        gpus = []  # the split GPU has fixed limits instead of growth
    for gpu in gpus:
        # DALI allocates GPU memory of its own beside TensorFlow's: let
        # TensorFlow grow into the memory it needs instead of taking it all.
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except (RuntimeError, ValueError):
            # TensorFlow has started (RuntimeError), or this process split the
            # GPU into logical GPUs (ValueError): its memory is set up already.
            pass
    if request.towers is None and not gpus and connect is None:
        logical_cpus = devices.default_cpu_towers()
    if logical_cpus is not None:
        split_host_cpu(logical_cpus)
    if connect is not None:
        connect()
    visible = [devices.canonical(d.name) for d in tf.config.list_logical_devices()]
    return devices.resolve(request, [d for d in visible if d is not None], physical)
