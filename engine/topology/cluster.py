"""Towers on other machines: the cluster, reaching its tasks, connecting to it.

The cluster is TensorFlow's own distributed runtime. Every worker runs a
`tf.distribute.Server` (`tower-worker`); this process connects to them with
`tf.config.experimental_connect_to_cluster`. Their devices then take towers
like local ones, and TensorFlow moves tensors between tasks over gRPC, worker
to worker where a reducer says so.

This process is the cluster's `chief` task 0 when the cluster names a chief
(TensorFlow's convention, and what two hosts need: workers send tensors back
to the chief's address), else a client on `localhost`, which only the local
machine can reach.

TensorFlow waits without end for a task that is down, so every task's address
is tried first, within a deadline, and a task that does not answer is named.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from collections.abc import Callable

from engine.errors import RunError, UsageError
from engine.topology.devices import CHIEF, CLIENT

_JOB = re.compile(r"^[A-Za-z_][\w-]*$")
_ADDRESS = re.compile(r"^(?P<host>[\w.-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")


class ClusterUnavailable(RunError):
    """The cluster's tasks cannot be reached, or this process cannot serve as
    its chief; the message is one line."""


class ClusterError(UsageError):
    """A cluster that cannot be used as given; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """The cluster this process trains on.

    Attributes:
      jobs: (job name, task addresses) pairs, e.g.
        (("worker", ("h1:2222", "h2:2222")),).
      connect_timeout: seconds to wait for every task to answer at start.
      source: where the cluster came from, for messages (`<cluster>` or
        `TF_CONFIG`).
    """

    jobs: tuple[tuple[str, tuple[str, ...]], ...]
    connect_timeout: float = 60.0
    source: str = "<cluster>"

    def __post_init__(self):
        if not self.connect_timeout > 0:
            raise ClusterError(
                f"<connect_timeout> ({self.connect_timeout:g}) must be positive"
            )
        chiefs = dict(self.jobs).get(CHIEF, ())
        if len(chiefs) > 1:
            raise ClusterError(
                f"{self.source}: {len(chiefs)} chief tasks; the chief is this "
                "process, so give one address for it"
            )
        far = [a for _, a in self.remote_tasks() if not is_loopback(a)]
        if far and not chiefs:
            raise ClusterError(
                f"{self.source}: {far[0]} may be on another host, and it must reach this "
                "process, which without a chief task is only 'localhost' to it; put "
                "chief=THIS_HOST:PORT; in front, e.g. 'chief=h0:2223;worker=...'"
            )

    @property
    def local_job(self) -> str:
        """The job this process is task 0 of."""
        return CHIEF if CHIEF in dict(self.jobs) else CLIENT

    @property
    def local_cpu(self) -> str:
        """This process's CPU, in full: where checkpoints are read and written."""
        return f"/job:{self.local_job}/replica:0/task:0/device:CPU:0"

    def remote_tasks(self) -> list[tuple[str, str]]:
        """(`/job:J/task:T`, address) of every task but this process."""
        return [
            (f"/job:{job}/task:{index}", address)
            for job, addresses in self.jobs
            if job != CHIEF
            for index, address in enumerate(addresses)
        ]

    def spec(self) -> dict[str, list[str]]:
        return {job: list(addresses) for job, addresses in self.jobs}


def parse(spec: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`worker=h1:2222,h2:2222` (jobs separated by `;`) -> jobs.

    Raises:
      ClusterError: naming the part that is not `job=host:port,...`.
    """
    jobs = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        job, sep, addresses = part.partition("=")
        job = job.strip()
        listed = tuple(a.strip() for a in addresses.split(","))
        if not sep or not _JOB.match(job) or not all(listed):
            raise ClusterError(
                f"<cluster> {spec!r}: {part!r} is not job=host:port[,host:port...]; "
                "e.g. worker=h1:2222,h2:2222 (jobs separated by ';')"
            )
        jobs.append((job, listed))
    if not jobs:
        raise ClusterError(
            f"<cluster> {spec!r} names no task; e.g. worker=h1:2222,h2:2222"
        )
    return _checked(jobs, "<cluster>")


def _tf_config(text: str) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], dict]:
    """(jobs, task) of a TF_CONFIG value (`{"cluster": {...}, "task": {...}}`)."""
    try:
        config = json.loads(text)
        cluster = config["cluster"]
        # An evaluator runs on its own, outside the cluster (TensorFlow's convention).
        jobs = [(str(job), tuple(addresses)) for job, addresses in cluster.items()
                if job != "evaluator"]
        if not all(isinstance(a, str) for _, addresses in jobs for a in addresses):
            raise TypeError("addresses must be strings")
        task = config.get("task") or {}
        if not isinstance(task, dict):
            raise TypeError("task must be an object")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ClusterError(
            f"TF_CONFIG is not JSON like {{\"cluster\": {{\"worker\": "
            f"[\"h1:2222\", \"h2:2222\"]}}}} ({err}); fix or unset it"
        ) from None
    return _checked(jobs, "TF_CONFIG"), task


def from_tf_config(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The jobs of a TF_CONFIG value, for the training process.

    Raises:
      ClusterError: TF_CONFIG is not JSON with a `cluster` of job -> address
        list, or its `task` is a task other than the chief.
    """
    jobs, task = _tf_config(text)
    if task and task.get("type") != CHIEF:
        raise ClusterError(
            f"TF_CONFIG names this process task {task.get('type')}/{task.get('index')}; "
            "training runs as the chief or outside the cluster, and workers run "
            "tower-worker; unset TF_CONFIG here or give <cluster>"
        )
    return jobs


def own_port(text: str | None) -> int:
    """The port of the task TF_CONFIG names, for tower-worker.

    Raises:
      ClusterError: no TF_CONFIG, no such task, or the task is the chief
        (which is the training process's).
    """
    if not text:
        raise ClusterError("give <port=P> (or set TF_CONFIG with this task's address)")
    jobs, task = _tf_config(text)
    kind, index = task.get("type"), task.get("index", 0)
    addresses = dict(jobs).get(kind, ())
    if kind == CHIEF or not isinstance(index, int) or not 0 <= index < len(addresses):
        raise ClusterError(
            f"TF_CONFIG's task {kind}/{index} is not a worker task of its cluster; give "
            "<port=P>, or a TF_CONFIG task like {\"type\": \"worker\", \"index\": 0}"
        )
    return int(addresses[index].rpartition(":")[2])


def valid_port(port: int) -> bool:
    return 0 < port < 65536


def _checked(jobs, source: str):
    for job, addresses in jobs:
        if job == CLIENT:
            raise ClusterError(
                f"{source}: the job name 'localhost' is TensorFlow's name for this "
                "process; call the workers' job 'worker'"
            )
        for address in addresses:
            match = _ADDRESS.match(address)
            if not match or not valid_port(int(match.group("port"))):
                raise ClusterError(
                    f"{source}: {job} address {address!r} is not host:port with a "
                    "port in 1..65535"
                )
    names = [job for job, _ in jobs]
    if len(set(names)) != len(names):
        raise ClusterError(f"{source}: a job is listed twice in {', '.join(names)}")
    return tuple(jobs)


def is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


def check_chief_port(options: ClusterOptions) -> None:
    """Refuses a chief address whose port this process cannot listen on.

    Raises:
      ClusterError: the port is taken.
    """
    chiefs = dict(options.jobs).get(CHIEF)
    if not chiefs:
        return
    port = int(chiefs[0].rpartition(":")[2])
    with socket.socket() as listener:
        # As gRPC does: connections of an earlier run (TIME_WAIT) do not count.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", port))
        except OSError as err:
            raise ClusterUnavailable(
                f"{options.source}: chief {chiefs[0]} is this process, but port {port} "
                f"cannot be listened on here ({err.strerror}); pick a free port"
            ) from None


def probe(address: str, timeout: float = 2.0) -> str | None:
    """None if something accepts connections at `address`, else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as err:
        return err.strerror or str(err)


def unreachable(options: ClusterOptions, timeout: float = 2.0,
                patience: float = 0.0) -> list[str]:
    """`/job:J/task:T at ADDRESS (reason)` for each task that does not answer.

    Args:
      options: the cluster.
      timeout: seconds each probe waits for a connection.
      patience: while every task answers, probe again for up to this many
        seconds: a process being killed tears its sockets down one by one,
        so its peers can hear of a lost connection before its port closes.
    """
    deadline = time.monotonic() + patience
    while True:
        down = []
        for task, address in options.remote_tasks():
            reason = probe(address, timeout)
            if reason:
                down.append(f"{task} at {address} ({reason})")
        if down or time.monotonic() >= deadline:
            return down
        time.sleep(0.25)


def from_remote(err: BaseException) -> bool:
    """Whether a TensorFlow error came over the wire from another task (a
    lost connection, a task that restarted), not from this process's ops."""
    import tensorflow as tf

    return (isinstance(err, (tf.errors.UnavailableError, tf.errors.AbortedError))
            or "from remote target" in str(getattr(err, "message", err)))


def silent(options: ClusterOptions, timeout: float = 3.0) -> list[str]:
    """`/job:J/task:T at ADDRESS` for each task whose TensorFlow server does
    not answer a status request (WorkerService/GetStatus, over gRPC like the
    runtime itself) within `timeout`: a frozen process still accepts TCP
    connections, but answers nothing."""
    import grpc

    quiet = []
    for task, address in options.remote_tasks():
        with grpc.insecure_channel(address) as channel:
            status = channel.unary_unary("/tensorflow.WorkerService/GetStatus")
            try:
                status(b"", timeout=timeout)  # GetStatusRequest has no fields
            except grpc.RpcError:
                quiet.append(f"{task} at {address}")
    return quiet


def wait_for_tasks(options: ClusterOptions, say: Callable[[str], None]) -> None:
    """Returns once every task answers; says which it waits for meanwhile.

    Raises:
      ClusterError: a task still does not answer after `connect_timeout`.
    """
    said = set()

    def waiting(task: str, address: str, reason: str) -> None:
        if task not in said:
            say(f"waiting for {task} at {address} ({reason}); up to "
                f"{options.connect_timeout:g} s")
            said.add(task)

    down = down_after_timeout(options, waiting)
    if down:
        task, address, reason = down[0]
        raise ClusterUnavailable(
            f"{options.source}: {task} at {address} does not answer ({reason}) "
            f"after {options.connect_timeout:g} s; start it there with: "
            f"tower-worker --port {address.rpartition(':')[2]}"
        )


def down_after_timeout(
    options: ClusterOptions, waiting: Callable[[str, str, str], None] | None = None,
) -> list[tuple[str, str, str]]:
    """Probes every remote task until all answer or `connect_timeout` has
    passed; returns (task, address, reason) for each that still does not
    answer (empty: all do). `waiting(task, address, reason)` hears of each
    task found down before then."""
    deadline = time.monotonic() + options.connect_timeout
    pending = options.remote_tasks()
    while True:
        still = [(task, address, reason) for task, address in pending
                 if (reason := probe(address, timeout=min(2.0, options.connect_timeout)))]
        if not still or time.monotonic() >= deadline:
            return still
        for down in still if waiting else ():
            waiting(*down)
        pending = [(task, address) for task, address, _ in still]
        time.sleep(0.5)


def connect(options: ClusterOptions) -> None:
    """Connects this process to the cluster; the workers' devices become visible."""
    import tensorflow as tf

    tf.config.experimental_connect_to_cluster(
        tf.train.ClusterSpec(options.spec()), job_name=options.local_job, task_index=0
    )
