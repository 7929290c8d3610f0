"""Splitting one physical device into logical ones, once per process:
the host CPU into `cpu:N` towers, GPU 0 into `gpu:N` towers."""

from __future__ import annotations

from collections.abc import Callable

from engine.topology.devices import DeviceError

__all__ = ["logical_gpu_map", "split_gpu", "split_host_cpu"]


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
