"""Process-wide set-up: what must be set before TensorFlow starts (op
determinism, inter-op threads, placement printing, the CPU allocator)."""

from __future__ import annotations

import os

from engine.errors import UsageError

__all__ = ["record_cpu_allocations", "reserve_inter_op_threads", "start"]


def record_cpu_allocations() -> None:
    """Makes TensorFlow's CPU allocator one that reports every allocation to
    the profiler, so the placement log's memory figures are exact on CPUs.

    TensorFlow's default CPU allocator reports none; with oneDNN (on by default
    only on CPUs with AVX-512 VNNI or AMX) large tensors come from a BFC
    allocator that reports them, small ones from a plain malloc that does not.
    Its BFC allocator, the kind every GPU uses, reports all. It is chosen when
    TensorFlow makes its first CPU allocator, so this takes effect only before
    TensorFlow runs anything; a `TF_CPU_ALLOCATOR_USE_BFC` the user set wins.
    """
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def reserve_inter_op_threads(towers: int) -> None:
    """Gives TensorFlow more inter-op threads than towers; call before it starts.

    In one process each collective holds an inter-op thread while it waits
    for the others.
    """
    import tensorflow as tf

    current = tf.config.threading.get_inter_op_parallelism_threads()
    cores = len(os.sched_getaffinity(0))
    tf.config.threading.set_inter_op_parallelism_threads(max(current, cores, towers + 2))


def start(
    *, deterministic: bool = False, collective_towers: int | None = None,
    log_device_placement: bool = False,
) -> None:
    """Sets what the run needs from TensorFlow's process-wide configuration.

    Args:
      deterministic: TensorFlow op determinism.
      collective_towers: with the `collective` reducer, the number of towers:
        each collective holds an inter-op thread while it waits.
      log_device_placement: TensorFlow's own placement printout.

    Raises:
      UsageError: TensorFlow already started with too few inter-op threads.
    """
    record_cpu_allocations()
    import tensorflow as tf

    if deterministic:
        tf.config.experimental.enable_op_determinism()
    if collective_towers is not None:
        try:
            reserve_inter_op_threads(collective_towers)
        except RuntimeError:  # TensorFlow has started: enough threads is fine
            have = tf.config.threading.get_inter_op_parallelism_threads()
            if 0 < have < collective_towers + 2:
                raise UsageError(
                    f"<reducer=collective> on {collective_towers} towers needs "
                    f"{collective_towers + 2} inter-op threads, but TensorFlow already "
                    f"started with {have}; make the Trainer before TensorFlow runs "
                    "anything, or use another reducer"
                ) from None
    if log_device_placement:
        tf.debugging.set_log_device_placement(True)
