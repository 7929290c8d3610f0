#!/usr/bin/env python3
"""Soak: a long deterministic run on two loopback workers under --max-restarts,
into which a seeded schedule injects faults; it must end as a run that lost
nothing would.

It first trains the run once without faults (the uninterrupted baseline),
then again with the faults below, each injected once the run has saved a
checkpoint since the last one, after a seeded wait:

  worker-kill       SIGKILL of a worker's server (tower-worker
                    --restart-on-exit serves again on its port)
  process-kill      SIGKILL of the training process (the OOM killer's way)
  worker-freeze     SIGSTOP of a worker's server past --step-timeout, then
                    SIGCONT
  kill-during-save  SIGKILL of the training process while a checkpoint is
                    being written
  full-disk         the run's disk (a tmpfs: checkpoints, metrics and
                    TensorBoard) filled until the run stops on a write that
                    does not fit, then freed
  process-term      SIGTERM of the training process: a preemption, saved and
                    not restarted; the soak starts the job again with
                    --resume, as a scheduler would
  job-term          SIGTERM of the whole job (the supervisor), the same

The run ends by itself; the soak then checks that its final weights equal the
baseline's (numpy's assert_array_equal), that the metrics file has each epoch
once and TensorBoard each step once, and prints the faults, the step each hit,
the checkpoint the run went back to and the steps redone. The checkpoint
folder must be on a tmpfs this process can mount (root); without one the
full-disk fault is left out, and the report says so.

    .venv/bin/python scripts/soak.py --minutes 20 --seed 0 --out soak-results
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
SCHEDULE = ("worker-kill", "process-kill", "worker-freeze", "kill-during-save", "full-disk",
            "process-term", "worker-kill", "kill-during-save", "process-kill", "job-term")
STEPS_PER_SECOND = 60  # two loopback workers of the mlp on a 2-core host (17 ms a step)
STEP_TIMEOUT = 20


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux's /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return [int(x) for x in listed.read().split()]
    except OSError:
        return []


def wait_for(predicate, seconds: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise SystemExit(f"soak: gave up waiting for {what} after {seconds:.0f} s")


class Worker:
    """A tower-worker --restart-on-exit on 127.0.0.1; `server()` is the
    child process that serves (the one a fault hits)."""

    def __init__(self, logs: str, index: int):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(os.path.join(logs, f"worker{index}.log"), "a")
        self.process = subprocess.Popen(
            [os.path.join(BIN, "tower-worker"), "--port", str(self.port), "--restart-on-exit"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def server(self) -> int:
        return wait_for(lambda: (children(self.process.pid) or [None])[0], 60,
                        f"worker {self.address} to serve")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Job:
    """The training job: `tower-train ... --max-restarts N` and its log."""

    def __init__(self, command: list[str], log_path: str):
        self.command = command
        self.log_path = log_path
        self.out = open(log_path, "a")
        self.process = None

    def start(self, resume: bool) -> None:
        self.process = subprocess.Popen(self.command + (["--resume"] if resume else []),
                                        stdout=self.out, stderr=subprocess.STDOUT, cwd=ROOT)

    def training(self) -> int:
        """The pid of the training process the supervisor runs now."""
        return wait_for(lambda: (children(self.process.pid) or [None])[0], 60,
                        "the training process")

    def text(self) -> str:
        with open(self.log_path) as log:
            return log.read()


def latest_step(directory: str) -> int:
    """The step of the newest checkpoint the state file lists (0: none)."""
    try:
        with open(os.path.join(directory, "checkpoint")) as state:
            found = re.search(r'^model_checkpoint_path: ".*ckpt-(\d+)"', state.read(), re.M)
    except OSError:
        return 0
    return int(found.group(1)) if found else 0


def mount_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True).returncode == 0


def fill(path: str) -> str:
    filler = os.path.join(path, "filler")
    with contextlib.suppress(OSError), open(filler, "wb") as out:
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


def command(folder: str, cluster: str, args, max_restarts: int) -> list[str]:
    return [os.path.join(BIN, "tower-train"), "--cluster", cluster,
            "--devices", "w0/cpu:0,w1/cpu:0", "--epochs", str(args.epochs),
            "--steps-per-epoch", str(args.steps_per_epoch), "--eval-steps", "2",
            "--deterministic", "--max-restarts", str(max_restarts),
            "--step-timeout", str(STEP_TIMEOUT), "--connect-timeout", "90",
            "--checkpoint-dir", os.path.join(folder, "ckpt"),
            "--checkpoint-every", str(args.checkpoint_every),
            "--metrics", os.path.join(folder, "metrics.jsonl"),
            "--logdir", os.path.join(folder, "tb"),
            "--save-model", os.path.join(folder, "model.keras")]


def inject(fault: str, job: Job, workers: list[Worker], checkpoints: str, rng) -> dict:
    """Does one fault to the running job; returns what was done."""
    if fault in ("worker-kill", "worker-freeze"):
        worker = rng.randrange(len(workers))
        server = workers[worker].server()
        if fault == "worker-kill":
            os.kill(server, signal.SIGKILL)
        else:
            os.kill(server, signal.SIGSTOP)
            time.sleep(STEP_TIMEOUT + 5)
            os.kill(server, signal.SIGCONT)
        return {"fault": fault, "worker": worker}
    if fault == "kill-during-save":
        saved = latest_step(checkpoints)
        pattern = re.compile(r"ckpt-(\d+)(_temp|\.index|\.data-.*)")

        def saving():
            for name in os.listdir(checkpoints):
                found = pattern.fullmatch(name)
                if found and int(found.group(1)) > saved:
                    return True
            return False

        pid = job.training()
        wait_for(saving, 600, "a checkpoint to be written", poll=0.0005)
        os.kill(pid, signal.SIGKILL)
        return {"fault": fault}
    if fault == "full-disk":
        before = job.text().count(" is full: ")
        filler = fill(checkpoints)
        wait_for(lambda: job.text().count(" is full: ") > before, 600, "a checkpoint that "
                 "does not fit")
        os.remove(filler)
        return {"fault": fault}
    if fault == "process-kill":
        os.kill(job.training(), signal.SIGKILL)
        return {"fault": fault}
    if fault == "process-term":
        os.kill(job.training(), signal.SIGTERM)
        return {"fault": fault}
    if fault == "job-term":
        job.process.send_signal(signal.SIGTERM)
        return {"fault": fault}
    raise ValueError(fault)


def steps_redone(text: str) -> list[dict]:
    """Each restart and stop the job's log says, with where in the log it
    is (`at`), the step it was at and the checkpoint it went back to."""
    events, at = [], 0
    for line in text.splitlines(keepends=True):
        found = None
        restart = re.search(r"restart \d+ of \d+: (.*?)(?: at step (\d+))?; going back to "
                            r".*ckpt-(\d+)", line)
        if restart:
            what, step, back = restart.groups()
            what = re.sub(r" at [\d.]+:\d+", "", what)  # the worker's address: the task says it
            found = (what, int(step) if step else None, int(back))
        stopped = re.search(r"stopped by (SIG\w+) after step (\d+); checkpoint saved: "
                            r".*ckpt-(\d+)", line)
        if stopped:
            found = (f"stopped by {stopped.group(1)}", int(stopped.group(2)),
                     int(stopped.group(3)))
        full = re.search(r"error: (--[\w-]+) '.*?' is full: (.*?)(?: was not written| needs "
                         r"about).*?the newest complete checkpoint, .*?ckpt-(\d+)", line)
        if full:
            flag, what, back = full.groups()
            found = (f"{flag} full ({what})", None, int(back))
        if found:
            what, step, back = found
            events.append({"said": what, "step": step, "back_to": back, "at": at,
                           "redone": None if step is None else step - back})
        at += len(line)
    return events


def report(done: list[dict], events: list[dict]) -> list[str]:
    """The faults, each with what the run said after it (before the next
    fault) and the steps it cost."""
    lines = ["  #  minute  fault             what the run said                              "
             "step  back to  redone"]
    for k, fault in enumerate(done):
        end = done[k + 1]["log_at"] if k + 1 < len(done) else float("inf")
        said = [e for e in events if fault["log_at"] <= e["at"] < end] or [None]
        for n, event in enumerate(said):
            head = (f"  {k + 1:<2} {fault['minute']:6.1f}  {fault['fault']:<17}" if n == 0
                    else " " * 30)
            if event is None:
                lines.append(f"{head} (nothing: the run went on)")
                continue
            step = "-" if event["step"] is None else str(event["step"])
            redo = "-" if event["redone"] is None else str(event["redone"])
            lines.append(f"{head} {event['said'][:44]:<44} {step:>6} {event['back_to']:>8} "
                         f"{redo:>7}")
    return lines


def check(folder: str, baseline: str, total_steps: int, epochs: int) -> list[str]:
    """The soak's verdicts: weights, metrics lines and TensorBoard steps."""
    import numpy as np

    sys.path.insert(0, ROOT)
    from engine import quiet

    quiet.import_quietly()  # without TensorFlow's start-up lines
    import keras
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    def weights(path):
        return [v.numpy() for v in keras.models.load_model(path).trainable_variables]

    for got, want in zip(weights(os.path.join(folder, "model.keras")),
                         weights(os.path.join(baseline, "model.keras")), strict=True):
        np.testing.assert_array_equal(got, want)
    with open(os.path.join(folder, "metrics.jsonl")) as stream:
        lines = [json.loads(line) for line in stream]
    assert [r["epoch"] for r in lines] == list(range(1, epochs + 1)), [r["epoch"] for r in lines]
    steps = []
    for path in sorted(os.listdir(os.path.join(folder, "tb"))):
        if path.startswith("events.out.tfevents"):
            for record in tf.data.TFRecordDataset(os.path.join(folder, "tb", path)):
                event = event_pb2.Event.FromString(record.numpy())
                steps += [event.step for v in event.summary.value if v.tag == "train/loss"]
    assert sorted(steps) == list(range(1, total_steps + 1)), "TensorBoard's steps"
    return ["final weights equal to the uninterrupted run's (assert_array_equal): yes",
            f"metrics file: epochs 1..{epochs}, each once: yes",
            f"TensorBoard train/loss: steps 1..{total_steps}, each once: yes"]


def run_job(job: Job, schedule, workers, checkpoints, seconds: float,
            rng) -> tuple[int, list[dict]]:
    """Runs the job to its end, injecting `schedule` spread over about
    `seconds` (the uninterrupted run's time); a stop (143) is followed by a
    resume, as a scheduler would."""
    done, mean_gap = [], seconds / (len(schedule) + 1)
    job.start(resume=False)
    started = time.monotonic()
    pending = list(schedule)
    while True:
        if pending and job.process.poll() is None:
            since = max(latest_step(checkpoints), 1)
            gap = rng.uniform(0.5, 1.5) * mean_gap
            deadline = time.monotonic() + gap
            while job.process.poll() is None and (
                    time.monotonic() < deadline or latest_step(checkpoints) <= since):
                time.sleep(0.2)
            if job.process.poll() is None:
                fault = pending.pop(0)
                at = time.monotonic() - started
                print(f"soak: {at / 60:5.1f} min: {fault}", flush=True)
                log_at = len(job.text())
                done.append({**inject(fault, job, workers, checkpoints, rng), "minute": at / 60,
                             "log_at": log_at})
                continue
        code = job.process.wait()
        if code == 128 + signal.SIGTERM:  # a stop, saved: the scheduler's resume
            print(f"soak: the job stopped (exit {code}); starting it again with --resume",
                  flush=True)
            job.start(resume=True)
            continue
        return code, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20,
                        help="about how long the run with faults trains (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed")
    parser.add_argument("--out", default="soak-results")
    parser.add_argument("--checkpoint-every", type=int, default=500)
    args = parser.parse_args()
    args.steps_per_epoch = 3000
    args.epochs = max(2, round(args.minutes * 60 * STEPS_PER_SECOND / 3000))
    total = args.epochs * args.steps_per_epoch
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    rng = random.Random(args.seed)
    workers = [Worker(out, k) for k in range(2)]
    disk = os.path.join(out, "faulted")
    tmpfs = mount_tmpfs(disk, "64m")
    schedule = [f for f in SCHEDULE if tmpfs or f != "full-disk"]
    try:
        for worker in workers:
            worker.server()
        cluster = (f"chief=127.0.0.1:{free_port()};"
                   f"worker={workers[0].address},{workers[1].address}")
        print(f"soak: {args.epochs} epochs of {args.steps_per_epoch} steps on two loopback "
              f"workers; {len(schedule)} faults, seed {args.seed}"
              + ("" if tmpfs else "; no tmpfs here, so no full-disk fault"), flush=True)
        baseline = os.path.join(out, "baseline")
        os.makedirs(baseline)
        start = time.monotonic()
        base = Job(command(baseline, cluster, args, 0), os.path.join(out, "baseline.log"))
        base.start(resume=False)
        if base.process.wait() != 0:
            raise SystemExit(f"soak: the baseline failed; see {base.log_path}")
        base_minutes = (time.monotonic() - start) / 60
        print(f"soak: the uninterrupted run took {base_minutes:.1f} min", flush=True)
        job = Job(command(disk, cluster, args, 50), os.path.join(out, "faulted.log"))
        start = time.monotonic()
        code, done = run_job(job, schedule, workers, os.path.join(disk, "ckpt"),
                             base_minutes * 60, rng)
        minutes = (time.monotonic() - start) / 60
        if code != 0:
            raise SystemExit(f"soak: the job ended with {code}; see {job.log_path}")
        events = steps_redone(job.text())
        verdicts = check(disk, baseline, total, args.epochs)
    finally:
        for worker in workers:
            worker.stop()
    redone = sum(e["redone"] or 0 for e in events)
    lines = [f"soak: exit 0 after {minutes:.1f} min (the uninterrupted run: "
             f"{base_minutes:.1f} min), {len(done)} faults injected, seed {args.seed}",
             *report(done, events)]
    lines += [f"  steps redone in all: {redone} of {total}", *[f"  {v}" for v in verdicts]]
    print("\n".join(lines))
    with open(os.path.join(out, "soak.json"), "w") as stream:
        json.dump({"minutes": minutes, "baseline_minutes": base_minutes, "faults": done,
                   "events": events, "steps": total, "seed": args.seed}, stream, indent=1)
    if tmpfs:
        subprocess.run(["umount", "-l", disk], check=False)


if __name__ == "__main__":
    main()
