"""Towers on other processes: tower-worker servers on loopback ports, tower-train
connected to them over TensorFlow's gRPC runtime, and what happens when a
worker is down, dies or freezes."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import time

import pytest
from conftest import BIN, REPO, run_cli

from engine.placement.report import LOCAL_TASK, by_task, load, matrix
from engine.topology import cluster as cluster_lib
from engine.topology import exposure

PARAMETER_BYTES = 407_080  # the mlp's float32 parameters


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Worker:
    """A tower-worker process on 127.0.0.1; `ready()` waits for its banner."""

    def __init__(self, log_dir, cpus: int = 1, port: int | None = None):
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(os.path.join(log_dir, f"worker-{self.port}.log"), "a")
        self.process = subprocess.Popen(
            [os.path.join(BIN, "tower-worker"), "--port", str(self.port), "--cpus", str(cpus)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=REPO, env=quiet_env(),
        )

    def ready(self, timeout: float = 60) -> Worker:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        self.banner = self.process.stdout.readline() if ready else ""
        assert "tower-worker: serving" in self.banner, self.banner
        return self

    def stop(self, timeout: float = 15) -> tuple[int, str]:
        """SIGTERM; returns the exit code and the last words."""
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, out.strip()


def quiet_env(**extra: str) -> dict:
    """The test's environment without TF_CONFIG (the tests name their clusters)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")}
    return {**env, **extra}


@pytest.fixture
def processes(tmp_path):
    """Starts workers and training runs; whatever is left is killed after the test."""
    started = []

    class Start:
        @staticmethod
        def worker(cpus: int = 1, port: int | None = None) -> Worker:
            worker = Worker(tmp_path, cpus, port)
            started.append(worker.process)
            return worker.ready()

        @staticmethod
        def train(args: list[str]) -> subprocess.Popen:
            started.append(subprocess.Popen(
                [os.path.join(BIN, args[0]), *args[1:]], cwd=REPO, env=quiet_env(),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            return started[-1]

    yield Start
    for process in reversed(started):  # training runs first, then their workers
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(timeout=15)


def train_args(mnist_dir, cluster: str, devices: str, *extra: str) -> list[str]:
    return ["tower-train", "--cluster", cluster, "--devices", devices, "--data", mnist_dir,
            *extra]


def read_metrics(path) -> list[dict]:
    with open(path) as stream:
        return [json.loads(line) for line in stream]


@pytest.mark.slow
def test_mnist_on_two_workers_matches_one_process(mnist_dir, tmp_path, processes):
    """Two towers on two worker processes train exactly as two towers on one
    process: the same shards, the same reduction, the same numbers."""
    w0, w1 = processes.worker(), processes.worker()
    chief = f"127.0.0.1:{free_port()}"
    common = ["--epochs", "1", "--steps-per-epoch", "150"]
    remote = run_cli(*train_args(
        mnist_dir, f"chief={chief};worker={w0.address},{w1.address}", "w0/cpu:0,w1/cpu:0",
        *common, "--metrics", str(tmp_path / "remote.jsonl"),
        "--placement-log", str(tmp_path / "placement.jsonl"),
    ))
    assert remote.returncode == 0, remote.stderr
    assert "tower 1  /job:worker/task:1/cpu:0 shard 1/2" in remote.stdout
    local = run_cli("tower-train", "--devices", "cpu:2", "--data", mnist_dir, *common,
                    "--metrics", str(tmp_path / "local.jsonl"))
    assert local.returncode == 0, local.stderr

    [there] = read_metrics(tmp_path / "remote.jsonl")
    [here] = read_metrics(tmp_path / "local.jsonl")
    assert there["eval_accuracy"] >= 0.91  # 0.927 in one process
    assert there["eval_accuracy"] == pytest.approx(here["eval_accuracy"], abs=1e-4)
    assert there["loss"] == pytest.approx(here["loss"], rel=1e-5)
    assert there["eval_samples"] == 10000

    # The placement log: each tower's batches and backward pass on its
    # worker, the parameters out to each worker and its gradients back.
    entries = load(str(tmp_path / "placement.jsonl"))
    towers = {("/job:worker/task:0/cpu:0", 0), ("/job:worker/task:1/cpu:0", 1)}
    backward = {(o["assigned"], o["tower"]) for o in entries
                if o["kind"] == "op" and o.get("step") == "train"
                and o["name"].startswith("gradient_tape/") and "MatMul" in o["op"]}
    assert backward == towers
    assert not [o for o in entries if o["kind"] == "op" and o["stray"]]
    between = by_task(matrix(entries, "train"))
    for task in ("/job:worker/task:0", "/job:worker/task:1"):
        assert PARAMETER_BYTES <= between[(LOCAL_TASK, task)] <= 1.01 * PARAMETER_BYTES
        assert PARAMETER_BYTES <= between[(task, LOCAL_TASK)] <= 1.01 * PARAMETER_BYTES
    assert "between tasks (over the network): 1,628," in remote.stdout

    for worker in (w0, w1):
        code, words = worker.stop()
        assert (code, words.splitlines()[-1]) == (0, "tower-worker: stopped by SIGTERM")


REPLICATED = ["--epochs", "1", "--steps-per-epoch", "60", "--eval-steps", "0",
              "--variables", "replicated", "--check-replicas", "30"]


@pytest.fixture(scope="module")
def central_on_one_host(mnist_dir, tmp_path_factory):
    """The metrics of three towers in one process with the central reducer."""
    metrics = tmp_path_factory.mktemp("central") / "local.jsonl"
    local = run_cli("tower-train", "--devices", "cpu:3", "--data", mnist_dir, *REPLICATED,
                    "--reducer", "central", "--metrics", str(metrics))
    assert local.returncode == 0, local.stderr
    [here] = read_metrics(metrics)
    return here


@pytest.mark.slow
@pytest.mark.xdist_group("central_on_one_host")  # its fixture runs once
@pytest.mark.parametrize("reducer", ["ring", "collective"])
def test_all_reduce_across_workers_keeps_replicas_equal(mnist_dir, tmp_path, processes, reducer,
                                                        central_on_one_host):
    """Replicated variables on three towers over two workers: the all-reduce
    runs between the workers, and the run equals the central one on one host."""
    w0, w1 = processes.worker(), processes.worker(cpus=2)
    remote = run_cli(*train_args(
        mnist_dir, f"worker={w0.address},{w1.address}", "w0/cpu:0,w1/cpu:0,w1/cpu:1",
        *REPLICATED, "--reducer", reducer, "--metrics", str(tmp_path / "remote.jsonl")))
    assert remote.returncode == 0, remote.stderr
    [there] = read_metrics(tmp_path / "remote.jsonl")
    assert there["loss"] == pytest.approx(central_on_one_host["loss"], rel=1e-5)


def wait_for_checkpoint(run: subprocess.Popen, directory, step: int,
                        seconds: float = 120) -> None:
    """Waits until `directory`'s `checkpoint` file names ckpt-`step` (or a
    later one): the save is then complete, where its `.index` file alone may
    appear while the save is still writing."""
    state = directory / "checkpoint"
    deadline = time.monotonic() + seconds
    while True:
        if state.exists():
            found = re.search(r'^model_checkpoint_path: ".*ckpt-(\d+)"', state.read_text(), re.M)
            if found and int(found.group(1)) >= step:
                return
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.2)


def last_error_after(run: subprocess.Popen, fault) -> str:
    """Does `fault()` to a running training; asserts the run then ends with
    exit 1 within 30 s (no hang) and returns its last line on stderr."""
    fault()
    started = time.monotonic()
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1, err
    assert time.monotonic() - started < 30
    return err.strip().splitlines()[-1]


@pytest.mark.slow
def test_worker_killed_mid_run_is_named_and_the_run_resumes(mnist_dir, tmp_path, processes):
    """The two-host layout (a chief), on loopback: a worker killed mid-run is
    named within seconds; restarted, the run resumes from its checkpoint with
    the surviving worker as it was."""
    w0, w1 = processes.worker(), processes.worker()
    checkpoints = tmp_path / "ckpt"
    cluster = f"chief=127.0.0.1:{free_port()};worker={w0.address},{w1.address}"
    args = train_args(mnist_dir, cluster, "w0/cpu:0,w1/cpu:0",
                      "--epochs", "1", "--steps-per-epoch", "3000", "--eval-steps", "0",
                      "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "20")
    run = processes.train(args)
    wait_for_checkpoint(run, checkpoints, 40)
    line = last_error_after(run, w1.process.kill)
    assert line.startswith(
        f"tower-train: error: lost /job:worker/task:1 at {w1.address} (Connection refused); "
        f"the last checkpoint is {checkpoints}/ckpt-"
    ), line
    assert line.endswith(" --resume"), line
    assert "once every worker is up again, resume with: .venv/bin/tower-train --cluster" in line
    saved = int(line.split("/ckpt-")[1].split(";")[0])
    assert saved >= 40

    processes.worker(port=w1.port)  # only the lost worker comes back
    # The printed command, with its length changed (a flag is given once).
    again = list(args[:-2])
    again[again.index("--steps-per-epoch") + 1] = str(saved + 30)
    resumed = run_cli(*again, "--checkpoint-every", "1000", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {checkpoints}/ckpt-{saved} at step {saved}" in resumed.stdout
    assert f"checkpoint: {checkpoints}/ckpt-{saved + 30}" in resumed.stdout
    assert w0.stop()[0] == 0  # the surviving worker served both runs and stops cleanly


def supervised(mnist_dir, cluster: str, folder, *extra: str) -> list[str]:
    """A deterministic two-worker run of 2 epochs of 30 steps under
    --max-restarts 2 that writes every kind of record into `folder`."""
    folder.mkdir(exist_ok=True)
    return train_args(
        mnist_dir, cluster, "w0/cpu:0,w1/cpu:0", "--epochs", "2", "--steps-per-epoch",
        "30", "--eval-steps", "2", "--deterministic", "--max-restarts", "2",
        "--checkpoint-dir", str(folder / "ckpt"), "--checkpoint-every", "10",
        "--metrics", str(folder / "metrics.jsonl"), "--logdir", str(folder / "tb"),
        "--save-model", str(folder / "model.keras"), *extra)


def event_steps(logdir, tag: str) -> list[int]:
    """The steps of `tag`'s scalars in the event files of `logdir`, in order."""
    import glob

    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    steps = []
    for path in sorted(glob.glob(str(logdir / "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return sorted(steps)


def model_values(path) -> list:
    """The weights of a saved model (a loaded model's dropout seeds are new)."""
    import keras

    return [v.numpy() for v in keras.models.load_model(str(path)).trainable_variables]


def kill_when(directory, pattern: str, process: subprocess.Popen, run: subprocess.Popen,
              seconds: float = 120) -> None:
    """SIGKILLs `process` as soon as a file or folder matching `pattern`
    appears in `directory` (polled every millisecond)."""
    deadline = time.monotonic() + seconds
    while not any(re.fullmatch(pattern, name) for name in
                  (os.listdir(directory) if directory.exists() else ())):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.001)
    process.kill()


FIGURES = ("epoch", "steps", "loss", "accuracy", "eval_loss", "eval_accuracy", "eval_samples")


@pytest.mark.slow
def test_a_lost_worker_comes_back_and_the_run_ends_as_an_uninterrupted_one(
        mnist_dir, tmp_path, processes):
    """--max-restarts: a worker killed mid-epoch, then one killed as a
    checkpoint starts to be written, each brought back on its port, then
    the training process itself SIGKILLed after a checkpoint; the run goes
    on by itself from its last checkpoint and ends with the figures,
    records and weights of a run that lost nothing."""
    import numpy as np

    w0, w1 = processes.worker(), processes.worker()
    cluster = f"chief=127.0.0.1:{free_port()};worker={w0.address},{w1.address}"
    whole = run_cli(*supervised(mnist_dir, cluster, tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    assert "restart" not in whole.stdout
    baseline = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    weights = model_values(tmp_path / "whole" / "model.keras")

    for name, pattern in (("mid-epoch", r"ckpt-20\.index"), ("saving", r"ckpt-40.*"),
                          ("training-process", None)):
        folder = tmp_path / name
        run = processes.train(supervised(mnist_dir, cluster, folder))
        if pattern is None:  # the chief's own process, as the OOM killer would end it
            from test_supervise import the_run_of

            child = the_run_of(run)
            wait_for_checkpoint(run, folder / "ckpt", 10)
            os.kill(child, signal.SIGKILL)
        else:
            kill_when(folder / "ckpt", pattern, w1.process, run)
            w1 = processes.worker(port=w1.port)  # back on the same port
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        restarts = re.findall(r"^tower-train: restart .*$", out, re.M)
        assert len(restarts) == 1, out
        lost = (r"the run's process ended by SIGKILL" if pattern is None else
                rf"lost /job:worker/task:1 at {w1.address} \([^)]+\)")
        wait = "" if pattern is None else r" once every task answers \(up to 60 s\)"
        assert re.fullmatch(
            rf"tower-train: restart 1 of 2: {lost} at step (\d+); going back to "
            rf"{folder}/ckpt/ckpt-(\d+){wait}; 1 restart left", restarts[0]), restarts[0]
        assert re.search(r"^resumed from .*/ckpt-\d+ at step \d+", out, re.M)
        # Each epoch and each step once, the figures of the run that lost nothing.
        records = read_metrics(folder / "metrics.jsonl")
        assert [[r[k] for k in FIGURES] for r in records] == [
            [r[k] for k in FIGURES] for r in baseline]
        assert event_steps(folder / "tb", "train/loss") == list(range(1, 61))
        for got, want in zip(model_values(folder / "model.keras"), weights):
            np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_a_worker_that_does_not_come_back_ends_the_run_with_the_resume_command(
        mnist_dir, tmp_path, processes):
    w0, w1 = processes.worker(), processes.worker()
    cluster = f"chief=127.0.0.1:{free_port()};worker={w0.address},{w1.address}"
    args = supervised(mnist_dir, cluster, tmp_path, "--connect-timeout", "3")
    run = processes.train(args)
    wait_for_checkpoint(run, tmp_path / "ckpt", 10)
    w1.process.kill()
    started = time.monotonic()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    assert time.monotonic() - started < 40  # the loss, the 3 s wait and the word
    assert re.search(r"^tower-train: restart 1 of 2: lost /job:worker/task:1 .*; going back "
                     r"to .*/ckpt-\d+ once every task answers \(up to 3 s\); 1 restart left$",
                     out, re.M), out
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"tower-train: error: /job:worker/task:1 at {w1.address} does not answer "
        rf"\(Connection refused\) after 3 s; the last checkpoint is {tmp_path}/ckpt/ckpt-\d+; "
        r"once every worker is up again, resume with: \.venv/bin/tower-train .* --resume",
        last), last
    assert "--max-restarts 2" in last  # the command as the user gave it


def read_line(process: subprocess.Popen, timeout: float = 60) -> str:
    """The next line of an unbuffered (bufsize=0, binary) stdout, or ''."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline().decode().rstrip("\n") if ready else ""


@pytest.mark.slow
def test_a_worker_says_who_can_reach_it(processes):
    worker = processes.worker()
    # Printed with the banner, at once.
    lines = [worker.process.stdout.readline().rstrip("\n") for _ in range(2)]
    assert lines == [f"tower-worker: {line}" for line in exposure.exposure_lines(worker.port)]
    assert lines[0].startswith(
        f"tower-worker: listening on every interface of this host: 127.0.0.1:{worker.port}")


def test_the_exposure_message_names_the_addresses_and_the_safe_set_ups():
    lines = exposure.exposure_lines(2222, ["127.0.0.1", "10.0.0.5"])
    assert lines[0] == ("listening on every interface of this host: 127.0.0.1:2222, "
                        "10.0.0.5:2222")
    assert lines[1].startswith("anyone who can reach one of these ports can run code in this "
                               "process: TensorFlow's server has no authentication;")
    assert "SSH tunnel" in lines[1] and "firewall rule" in lines[1]
    assert exposure.exposure_lines(2222, ["127.0.0.1"])[1] == (
        "reachable from this host only (no other interface has an address)")


@pytest.mark.slow
def test_a_worker_killed_under_restart_on_exit_serves_again_on_its_port(tmp_path):
    port = free_port()
    keeper = subprocess.Popen(
        [os.path.join(BIN, "tower-worker"), "--port", str(port), "--restart-on-exit"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, cwd=REPO,
        env=quiet_env())
    try:
        banner = read_line(keeper)
        first = int(re.search(r"\(pid (\d+)\)", banner)[1])
        assert first != keeper.pid  # the server is a child
        os.kill(first, signal.SIGKILL)
        lines = [read_line(keeper) for _ in range(4)]
        assert f"tower-worker: the server (pid {first}) ended (killed by SIGKILL); serving " \
               f"again on port {port}" in lines
        again = next(line for line in lines if line.startswith("tower-worker: serving"))
        assert int(re.search(r"\(pid (\d+)\)", again)[1]) != first
        assert cluster_lib.probe(f"127.0.0.1:{port}") is None
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=30) == 0
    finally:
        if keeper.poll() is None:
            keeper.kill()


def test_restart_on_exit_gives_up_on_a_server_that_cannot_start():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [os.path.join(BIN, "tower-worker"), "--port", str(port), "--restart-on-exit"],
            capture_output=True, text=True, timeout=60, cwd=REPO, env=quiet_env())
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"tower-worker: error: --port {port} is already in use on this host; stop what "
        "serves there or pick another port",
        "tower-worker: the server could not start (exit code 1); not starting it again"]


@pytest.mark.slow
def test_worker_down_at_start_is_named_within_the_timeout(mnist_dir, processes):
    up = processes.worker()
    down = f"127.0.0.1:{free_port()}"
    config = {"cluster": {"worker": [up.address, down]}}
    started = time.monotonic()
    result = subprocess.run(
        [os.path.join(BIN, "tower-train"), "--devices", "w0/cpu:0,w1/cpu:0", "--data",
         mnist_dir, "--connect-timeout", "3"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env=quiet_env(TF_CONFIG=json.dumps(config)),
    )
    assert time.monotonic() - started < 40
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"tower-train: error: TF_CONFIG: /job:worker/task:1 at {down} does not answer "
        f"(Connection refused) after 3 s; start it there with: tower-worker --port "
        f"{down.rpartition(':')[2]}"
    )
    assert f"waiting for /job:worker/task:1 at {down}" in result.stdout


@pytest.mark.slow
def test_frozen_worker_stops_the_run_at_the_step_timeout(mnist_dir, tmp_path, processes):
    """A worker that stops answering (SIGSTOP) would make TensorFlow wait
    forever; the step timeout ends the run and says what it found."""
    w0, w1 = processes.worker(), processes.worker()
    checkpoints = tmp_path / "ckpt"
    args = train_args(mnist_dir, f"worker={w0.address},{w1.address}", "w0/cpu:0,w1/cpu:0",
                      "--epochs", "1", "--steps-per-epoch", "3000", "--eval-steps", "0",
                      "--step-timeout", "5", "--checkpoint-dir", str(checkpoints),
                      "--checkpoint-every", "20")
    run = processes.train(args)
    wait_for_checkpoint(run, checkpoints, 20)
    last = last_error_after(run, lambda: w1.process.send_signal(signal.SIGSTOP))
    # Saves come every 20 steps, so the freeze lands in a step or in a save:
    # both wait on the worker, and both are under the deadline.
    assert re.match(
        r"tower-train: error: (a train step|saving a checkpoint) \(--step-timeout 5\) has "
        r"not finished after \d+ s; accepting connections but not answering TensorFlow "
        rf"\(frozen or overloaded\): /job:worker/task:1 at {re.escape(w1.address)}; the last "
        rf"checkpoint is {re.escape(str(checkpoints))}/ckpt-\d+; once every worker is up "
        r"again, resume with: .venv/bin/tower-train .* --resume$", last), last


@pytest.mark.slow
def test_a_frozen_worker_under_max_restarts_is_a_restart_once_it_thaws(
        mnist_dir, tmp_path, processes):
    """A step that outlives --step-timeout on a frozen worker is a lost
    worker too: the run restarts from its checkpoint, and finishes once the
    worker answers again."""
    w0, w1 = processes.worker(), processes.worker()
    checkpoints = tmp_path / "ckpt"
    args = train_args(mnist_dir, f"worker={w0.address},{w1.address}", "w0/cpu:0,w1/cpu:0",
                      "--epochs", "1", "--steps-per-epoch", "200", "--eval-steps", "0",
                      "--step-timeout", "5", "--connect-timeout", "60",
                      "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "20",
                      "--max-restarts", "1")
    run = processes.train(args)
    wait_for_checkpoint(run, checkpoints, 20)
    w1.process.send_signal(signal.SIGSTOP)
    restart = ""
    while not restart.startswith("tower-train: restart"):
        restart = run.stdout.readline()
        assert restart or run.poll() is None, run.communicate()
    w1.process.send_signal(signal.SIGCONT)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert re.fullmatch(
        rf"tower-train: restart 1 of 1: lost /job:worker/task:1 at {re.escape(w1.address)}; "
        rf"going back to {re.escape(str(checkpoints))}/ckpt-\d+ once every task answers "
        r"\(up to 60 s\); 0 restarts left\n", restart), restart
    assert f"checkpoint: {checkpoints}/ckpt-200" in out


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--devices", "w1/cpu:0"], {},
         "--devices: /job:worker/task:1/cpu:0 is on another task; name the cluster with "
         "--cluster worker=HOST:PORT,... (or TF_CONFIG)"),
        (["--devices", "cpu:2", "--reduce-device", "/job:worker/task:0/device:CPU:0"], {},
         "--reduce-device: /job:worker/task:0/cpu:0 is on another task; name the cluster "
         "with --cluster worker=HOST:PORT,... (or TF_CONFIG)"),
        (["--cluster", "worker=h1", "--devices", "w0/cpu:0"], {},
         "--cluster: worker address 'h1' is not host:port with a port in 1..65535"),
        (["--cluster", "h1:2222", "--devices", "w0/cpu:0"], {},
         "--cluster 'h1:2222': 'h1:2222' is not job=host:port[,host:port...]; "
         "e.g. worker=h1:2222,h2:2222 (jobs separated by ';')"),
        (["--cluster", "chief=a:1,b:2;worker=c:3", "--devices", "w0/cpu:0"], {},
         "--cluster: 2 chief tasks; the chief is this process, so give one address for it"),
        (["--devices", "w0/cpu:0"],
         {"TF_CONFIG": '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}'},
         "TF_CONFIG names this process task worker/0; training runs as the chief or "
         "outside the cluster, and workers run tower-worker; unset TF_CONFIG here or give "
         "--cluster"),
        (["--cluster", "worker=127.0.0.1:1", "--devices", "w0/cpu:0", "--step-timeout", "0"],
         {}, "--step-timeout (0) must be positive"),
        (["--cluster", "worker=h1:2222,h2:2222", "--devices", "w0/cpu:0"], {},
         "--cluster: h1:2222 may be on another host, and it must reach this process, which "
         "without a chief task is only 'localhost' to it; put chief=THIS_HOST:PORT; in "
         "front, e.g. 'chief=h0:2223;worker=...'"),
        (["--cluster", "localhost=127.0.0.1:5", "--devices", "w0/cpu:0"], {},
         "--cluster: the job name 'localhost' is TensorFlow's name for this process; call "
         "the workers' job 'worker'"),
        (["--cluster", "worker=127.0.0.1:1", "--devices", "w0/cpu:0", "--max-restarts", "1"],
         {}, "--max-restarts 1 goes back to the newest checkpoint after a crash; add "
         "--checkpoint-dir DIR (and --checkpoint-every STEPS for checkpoints within an "
         "epoch)"),
        (["--cluster", "worker=127.0.0.1:1", "--devices", "w0/cpu:0", "--max-restarts", "-1"],
         {}, "--max-restarts (-1) must be 0 or more"),
    ],
)
def test_bad_cluster_input_is_one_line(args, env, message):
    result = subprocess.run([os.path.join(BIN, "tower-train"), *args], capture_output=True,
                            text=True, timeout=60, cwd=REPO, env=quiet_env(**env))
    assert (result.returncode, result.stderr.strip()) == (2, f"tower-train: error: {message}")


def test_worker_refuses_a_bad_or_busy_port(processes):
    bad = run_cli("tower-worker", "--port", "70000")
    assert (bad.returncode, bad.stderr.strip()) == (
        2, "tower-worker: error: --port 70000 is not a port; use 1..65535")
    busy = processes.worker()
    again = run_cli("tower-worker", "--port", str(busy.port))
    assert (again.returncode, again.stderr.strip()) == (
        1, f"tower-worker: error: --port {busy.port} is already in use on this host; "
        "stop what serves there or pick another port")


def test_cluster_specs_parse():
    assert cluster_lib.parse("worker=h1:2222, h2:2222") == (("worker", ("h1:2222", "h2:2222")),)
    options = cluster_lib.ClusterOptions(cluster_lib.parse("chief=h0:1;worker=h1:2,h2:3"))
    assert options.local_job == "chief"
    assert options.local_cpu == "/job:chief/replica:0/task:0/device:CPU:0"
    assert options.remote_tasks() == [("/job:worker/task:0", "h1:2"),
                                      ("/job:worker/task:1", "h2:3")]
    config = '{"cluster": {"worker": ["h1:2", "[::1]:3"]}, "task": {"type": "chief", "index": 0}}'
    assert cluster_lib.from_tf_config(config) == (("worker", ("h1:2", "[::1]:3")),)
    with pytest.raises(cluster_lib.ClusterError, match="TF_CONFIG is not JSON"):
        cluster_lib.from_tf_config("{")
    with pytest.raises(cluster_lib.ClusterError, match="a job is listed twice"):
        cluster_lib.parse("worker=h:1;worker=h:2")


def test_a_port_that_closes_a_moment_after_the_error_is_still_found_down():
    """A killed worker's peers can hear of the lost connection before its port
    closes; the probe after a remote error waits a little for the port."""
    import threading

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    options = cluster_lib.ClusterOptions(jobs=(("worker", (address,)),))
    threading.Timer(0.8, listening.close).start()
    assert cluster_lib.unreachable(options) == []  # at once: it still answers
    down = cluster_lib.unreachable(options, patience=3.0)
    assert down == [f"/job:worker/task:0 at {address} (Connection refused)"]
