"""Process-wide set-up: what must be set before TensorFlow starts (op
determinism, inter-op threads, placement printing, the CPU allocator), and the
connection to a cluster, watched by a watchdog from the first exchange on."""

from __future__ import annotations

import os
from collections.abc import Callable

from engine.errors import UsageError
from engine.run.watchdog import Watchdog
from engine.topology import cluster as cluster_lib

__all__ = ["connector", "record_cpu_allocations", "start", "watch_cluster"]


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
        from engine.reducers.collective import reserve_inter_op_threads

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


def watch_cluster(
    options: cluster_lib.ClusterOptions,
    step_timeout: float,
    say: Callable[[str], None],
    warn: Callable[[str], None],
    advice: Callable[[], str],
) -> Watchdog:
    """Waits for every task to answer; returns the watchdog that bounds the
    connection and each step from here on.

    Args:
      options: the cluster.
      step_timeout: seconds a step (or a connection, a save) may take.
      say: progress while waiting.
      warn: the one line printed when a deadline passes, before the run stops.
      advice: what to do then (where the last checkpoint is, how to resume).

    Raises:
      ClusterError: the chief's port is taken, or a task never answers.
    """
    cluster_lib.check_chief_port(options)
    cluster_lib.wait_for_tasks(options, say)

    def overrun(what: str, seconds: float) -> None:
        down = cluster_lib.unreachable(options)
        frozen = [] if down else cluster_lib.silent(options)
        if down:
            detail = f"not answering: {'; '.join(down)}"
        elif frozen:
            detail = (f"accepting connections but not answering TensorFlow (frozen or "
                      f"overloaded): {'; '.join(frozen)}")
        else:
            detail = ("every task answers, so the work is slow or the workers cannot "
                      "reach this process (check the chief address and its port)")
        warn(f"{what} has not finished after {seconds:.0f} s; {detail}; {advice()}")

    return Watchdog(step_timeout, overrun, label=f"<step_timeout={step_timeout:g}>")


def connector(
    options: cluster_lib.ClusterOptions | None, watchdog: Watchdog | None
) -> Callable[[], None] | None:
    """What `devices.configure` calls to connect, under the watchdog, or None."""
    if options is None:
        return None

    def connect():
        import tensorflow as tf

        # Listing the devices is the first exchange with every task.
        watchdog.guard(
            f"connecting to the cluster (<connect_timeout={options.connect_timeout:g}>)",
            lambda: (cluster_lib.connect(options), tf.config.list_logical_devices()),
            timeout=options.connect_timeout,
        )

    return connect
