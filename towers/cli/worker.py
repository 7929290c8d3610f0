"""`tower-worker`: one task of a cluster, serving its devices to tower-train.

It starts a TensorFlow server (`tf.distribute.Server`) on a port, with the
DALI TensorFlow plugin imported first: a tower placed on this worker runs its
DALIDataset here, and the server can only run ops it knows. tower-train sends
the whole cluster's layout when it connects, so a worker needs only its port.
SIGTERM or Ctrl-C stops it, exit code 0.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import click

from engine.topology import exposure
from engine.topology.cluster import probe, valid_port
from towers.cli.common import OneLineCommand, UsageFailure, fail, import_tensorflow


@click.command(name="tower-worker", cls=OneLineCommand)
@click.option("--port", default=None, type=int,
              help="Port to serve on. Default: this task's port in TF_CONFIG.")
@click.option("--cpus", default=1, show_default=True, type=int,
              help="Split this host's CPU into N logical devices (cpu:0..N-1), "
              "to try several towers per worker without GPUs.")
@click.option("--restart-on-exit", is_flag=True,
              help="Serve from a child process, and start it again on the same port "
              "whenever it dies (killed, out of memory): with tower-train --max-restarts, "
              "a run that loses this worker comes back by itself.")
def tower_worker(port, cpus, restart_on_exit):
    """Serve this machine's devices to tower-train over gRPC."""
    if port is None:
        port = _port_from_tf_config()
    if not valid_port(port):
        raise UsageFailure(f"--port {port} is not a port; use 1..65535")
    if cpus < 1:
        raise UsageFailure(f"--cpus ({cpus}) must be at least 1")
    if restart_on_exit:
        sys.exit(_keep_serving(port, cpus))
    if probe(f"127.0.0.1:{port}") is None:
        fail("tower-worker", f"--port {port} is already in use on this host; "
             "stop what serves there or pick another port", 1)
    import_tensorflow()  # the DALI plugin's ops too, before the server starts
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(
        device_count={"CPU": cpus},
        # As on tower-train's own devices: each collective participant holds
        # an inter-op thread while it waits (more towers than threads can
        # deadlock), and DALI allocates GPU memory beside TensorFlow's.
        inter_op_parallelism_threads=max(len(os.sched_getaffinity(0)), cpus + 2),
    )
    config.gpu_options.allow_growth = True
    try:
        tf.distribute.Server(
            tf.train.ClusterSpec({"worker": {0: f"localhost:{port}"}}),
            job_name="worker",
            task_index=0,
            protocol="grpc",
            config=config,
            start=True,
        )
    except tf.errors.OpError as err:
        fail("tower-worker", f"cannot serve on port {port}: {err.message.splitlines()[0]}", 1)
    gpus = [f"GPU:{k}" for k in range(len(tf.config.list_physical_devices("GPU")))]
    devices = ", ".join([f"CPU:{k}" for k in range(cpus)] + gpus)
    click.echo(
        f"tower-worker: serving {socket.gethostname()}:{port} (pid {os.getpid()}); "
        f"devices {devices}; DALI ops registered; stop with Ctrl-C or SIGTERM",
    )
    for line in exposure.exposure_lines(port):
        click.echo(f"tower-worker: {line}")
    sys.stdout.flush()
    _wait_for_stop()


# A server that ends with an error sooner than this after its start could
# not start, and would not the next time either.
START_SECONDS = 20.0


def _keep_serving(port: int, cpus: int) -> int:
    """--restart-on-exit: runs the server as a child process and starts it
    again, on the same port, each time it dies; SIGTERM or Ctrl-C stops the
    child and ends with its exit code 0. A child that stops cleanly (SIGTERM
    sent to it) ends this too."""
    command = [sys.executable, "-m", "towers.cli.worker", "--port", str(port),
               "--cpus", str(cpus)]
    child = None
    stopping = []

    def on_signal(number, frame):
        stopping.append(number)
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while True:
        started = time.monotonic()
        child = subprocess.Popen(command)
        code = child.wait()
        if stopping or code == 0:
            return 0 if stopping else code
        if code > 0 and time.monotonic() - started < START_SECONDS:
            # It could not start (a busy port, a broken install): that repeats.
            click.echo(f"tower-worker: the server could not start (exit code {code}); "
                       "not starting it again", err=True)
            return code
        why = (f"killed by {signal.Signals(-code).name}" if code < 0
               else f"exit code {code}")
        click.echo(f"tower-worker: the server (pid {child.pid}) ended ({why}); "
                   f"serving again on port {port}")
        sys.stdout.flush()
        deadline = time.monotonic() + 30
        while probe(f"127.0.0.1:{port}") is None and time.monotonic() < deadline:
            time.sleep(0.2)  # until the port is free again


def _wait_for_stop() -> None:
    """Blocks until SIGTERM or SIGINT, then ends the process at once: the
    server has no clean shutdown, and nothing here needs saving."""
    stopped = threading.Event()
    received = []

    def on_signal(number, frame):
        received.append(signal.Signals(number).name)
        stopped.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while not stopped.wait(1.0):
        pass
    click.echo(f"tower-worker: stopped by {received[0]}")
    sys.stdout.flush()
    os._exit(0)


def _port_from_tf_config() -> int:
    """This task's port from TF_CONFIG's cluster and task."""
    from engine.topology import cluster

    try:
        return cluster.own_port(os.environ.get("TF_CONFIG"))
    except cluster.ClusterError:
        raise  # OneLineCommand names the flags


def main():
    tower_worker.main(prog_name="tower-worker")


if __name__ == "__main__":
    main()
