"""Opening a run: the process-wide set-up, the cluster (reached under a
watchdog from its first exchange on), and the placement of the towers.

The one way into the devices for the Trainer, `tower-reduce-bench` and the
benchmarks. Nothing here imports TensorFlow until `open_session`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from engine.errors import UsageError
from engine.run.watchdog import Watchdog
from engine.topology import cluster as cluster_lib
from engine.topology import devices as devs
from engine.topology import splits
from engine.topology.devices import DeviceRequest, Placement

__all__ = ["Session", "cluster_options", "open_session"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Session:
    """Where a run's work goes, once its devices are reached.

    Attributes:
      placement: the towers and the reduce device.
      cluster: the cluster, or None for this process's devices alone.
      watchdog: bounds every exchange with the cluster's tasks; None without one.
    """

    placement: Placement
    cluster: cluster_lib.ClusterOptions | None = None
    watchdog: Watchdog | None = None


def cluster_options(spec: str | None, connect_timeout: float, request):
    """The cluster from `spec`, else from TF_CONFIG, else None; remote towers
    without one are refused.

    Raises:
      ClusterError: a malformed cluster or TF_CONFIG.
      UsageError: a device on another task and no cluster.
    """
    text = os.environ.get("TF_CONFIG") if spec is None else spec
    remote = [
        (argument, name)
        for argument, names in (("devices", request.towers or ()),
                                ("reduce_device", (request.reduce_device,)))
        for name in names
        if name and devs.task_of(name)
    ]
    if not text or not text.strip():
        if remote:
            argument, name = remote[0]
            raise UsageError(
                f"<{argument}>: {name} is on another task; name the cluster with "
                "<cluster=worker=HOST:PORT,...> (or TF_CONFIG)"
            )
        return None
    if spec is None:
        jobs, source = cluster_lib.from_tf_config(text), "TF_CONFIG"
    else:
        jobs, source = cluster_lib.parse(text), "<cluster>"
    return cluster_lib.ClusterOptions(jobs, connect_timeout, source)


def open_session(
    request: DeviceRequest,
    *,
    cluster: cluster_lib.ClusterOptions | None = None,
    step_timeout: float = 300.0,
    deterministic: bool = False,
    collective_towers: int | None = None,
    log_device_placement: bool = False,
    say: Callable[[str], None] = print,
    warn: Callable[[str], None] = print,
    advice: Callable[[], str] = lambda: "",
    on_lost: Callable[[tuple[str, ...]], None] | None = None,
) -> Session:
    """Sets TensorFlow's process-wide options, waits for the cluster's tasks
    (under a watchdog from then on), splits logical devices and resolves the
    request into a placement.

    Args:
      request: the parsed devices (`engine.topology.devices.parse_request`).
      cluster: the cluster (`cluster_options`), or None.
      step_timeout: seconds a step, a connection or a save may take with a cluster.
      deterministic: TensorFlow op determinism.
      collective_towers: towers of the `collective` reducer, which each hold
        an inter-op thread while they wait; None when it is not used.
      log_device_placement: TensorFlow's own placement printout.
      say: progress while waiting for the cluster.
      warn: the one line printed when a deadline passes, before the run stops.
      advice: what to do then (where the last checkpoint is, how to resume).
      on_lost: told the tasks that stopped answering when a deadline passes
        (`tower-train --max-restarts` exits there for its supervisor to
        start the run again); None: the run stops with `warn`'s line.

    Returns:
      The session: placement, cluster and watchdog.

    Raises:
      DeviceError: a device that does not exist, naming those that do.
      ClusterError: the chief's port is taken, or a task never answers.
    """
    from engine.topology import process

    process.start(deterministic=deterministic, collective_towers=collective_towers,
                  log_device_placement=log_device_placement)
    watchdog = None
    if cluster is not None:
        watchdog = watch_cluster(cluster, step_timeout, say, warn, advice, on_lost)
    placement = splits.configure(request, connector(cluster, watchdog))
    if request.towers is None and cluster is None and all(
            t.gpu_index is None for t in placement.towers):
        n = len(placement.towers)
        say(f"devices 'all': TensorFlow sees no GPU here, so {n} CPU tower{'s' * (n != 1)}, "
            "one per core ('cpu:N' sets another count)")
    return Session(placement=placement, cluster=cluster, watchdog=watchdog)


def watch_cluster(
    options: cluster_lib.ClusterOptions,
    step_timeout: float,
    say: Callable[[str], None],
    warn: Callable[[str], None],
    advice: Callable[[], str],
    on_lost: Callable[[tuple[str, ...]], None] | None = None,
) -> Watchdog:
    """Waits for every task to answer; returns the watchdog that bounds the
    connection and each step from here on.

    Args:
      options: the cluster.
      step_timeout: seconds a step (or a connection, a save) may take.
      say: progress while waiting.
      warn: the one line printed when a deadline passes, before the run stops.
      advice: what to do then (where the last checkpoint is, how to resume).
      on_lost: told the tasks that stopped answering (see `open_session`).

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
        if (down or frozen) and on_lost is not None:
            on_lost(tuple(down or frozen))
        warn(f"{what} has not finished after {seconds:.0f} s; {detail}; {advice()}")

    return Watchdog(step_timeout, overrun, label=f"<step_timeout={step_timeout:g}>")


def connector(
    options: cluster_lib.ClusterOptions | None, watchdog: Watchdog | None
) -> Callable[[], None] | None:
    """What `splits.configure` calls to connect, under the watchdog, or None."""
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
