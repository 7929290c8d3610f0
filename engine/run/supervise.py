"""Supervised restarts: a run that dies (its process killed, a crash, a
lost worker of its cluster) comes back by itself, from its newest
checkpoint, up to a number of times.

The run is a child process (a `tower-train` command line). Whatever ends it
but the job's own stop (exit 0, bad input, or a stop by Ctrl-C or SIGTERM,
which saves first) is a crash, and the supervisor starts the command again
with `--resume`, as torchrun restarts its workers whatever ended them. The
child reports the last step it finished in the file named by STEP_FILE, so
that each restart says where the run was, and a crash loop (the same
failure at the same step twice in a row) ends with one line instead of
every restart left. A crash before the first checkpoint ends the same way:
there is nothing to go back to.

A run on a cluster that loses a worker writes what it lost to the file
named by LOST_FILE and exits with LOST_EXIT; the supervisor then waits for
every task to answer again, up to `connect_timeout`, before the restart.
The last allowed attempt runs without LOST_FILE, so a loss past the limit
ends as an unsupervised run does: one line and the resume command.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence

from engine.topology.cluster import ClusterOptions, down_after_timeout

__all__ = ["LOST_EXIT", "LOST_FILE", "STEP_FILE", "STOP_EXITS", "USAGE_EXIT", "Lost",
           "StepReport", "latest_checkpoint", "report_lost", "run_child", "supervise"]

# The exit code of a run that lost a worker and may be restarted (EX_TEMPFAIL).
LOST_EXIT = 75
# The environment variable that names where such a run writes what it lost.
LOST_FILE = "TOWER_TRAIN_LOST_FILE"
# The environment variable that names where a supervised run keeps its last step.
STEP_FILE = "TOWER_TRAIN_STEP_FILE"
# Endings that are the job's own, never restarted: bad input (the same
# command would be refused again), and a stop by Ctrl-C or SIGTERM, which
# saves a checkpoint first (a preemption: whoever sent it starts it again).
USAGE_EXIT = 2
STOP_EXITS = (128 + signal.SIGINT, 128 + signal.SIGTERM)


@dataclasses.dataclass(frozen=True)
class Lost:
    """What a run lost: the tasks (`/job:worker/task:1 at host:port (why)`),
    and the last step it finished (None: not known, a step that froze)."""

    tasks: tuple[str, ...]
    step: int | None = None


def latest_checkpoint(directory: str) -> str | None:
    """The newest checkpoint `directory`'s state file lists (what
    `tf.train.latest_checkpoint` gives), read without TensorFlow."""
    try:
        with open(os.path.join(directory, "checkpoint")) as state:
            text = state.read()
    except OSError:
        return None
    found = re.search(r'^model_checkpoint_path: "(.*)"$', text, re.M)
    if not found:
        return None
    path = found.group(1)
    return path if os.path.isabs(path) else os.path.join(directory, path)


def report_lost(lost: Lost) -> bool:
    """In a supervised run, writes `lost` for the supervisor and returns
    True (the caller then exits with LOST_EXIT); False when unsupervised."""
    path = os.environ.get(LOST_FILE)
    if not path:
        return False
    with open(path, "w") as out:
        json.dump(dataclasses.asdict(lost), out)
    return True


class StepReport:
    """The child's side of STEP_FILE: after every step, the step's number
    written in place (a fixed-width line, so a reader never sees half of
    one), cheap enough for every step. A callback (`on_train_batch_end`)."""

    WIDTH = 20

    def __init__(self, path: str | None):
        """`path` None keeps the step here only (`step`)."""
        self.step: int | None = None
        self._fd = None if path is None else os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def on_train_batch_end(self, batch: int, logs: dict) -> None:
        self.step = logs["step"]
        if self._fd is not None:
            os.pwrite(self._fd, f"{self.step:>{self.WIDTH}}\n".encode(), 0)

    @classmethod
    def read(cls, path: str) -> int | None:
        """The last step written to `path`, or None before the first."""
        try:
            with open(path) as stream:
                text = stream.read().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None


@dataclasses.dataclass(frozen=True)
class Ending:
    """How one run of the command ended: its exit status (negative: the
    signal that killed it), the last step it reported, and the worker it
    lost, if that is why."""

    status: int
    step: int | None
    lost: Lost | None = None

    @property
    def exit_code(self) -> int:
        """The status as a shell reports it (128 + the signal's number)."""
        return 128 - self.status if self.status < 0 else self.status

    def cause(self) -> str:
        """What ended the run, for a one-line message."""
        at = f" at step {self.step}" if self.step is not None else " before its first step"
        if self.lost is not None:
            lost_at = f" at step {self.lost.step}" if self.lost.step is not None else ""
            return f"lost {'; '.join(self.lost.tasks)}{lost_at}"
        if self.status < 0:
            return f"the run's process ended by {signal.Signals(-self.status).name}{at}"
        return f"the run's process exited with {self.status}{at}"

    def same_failure(self, other: Ending | None) -> bool:
        """A crash loop: this run failed as `other` did, at the same step."""
        return (other is not None and self.lost is None and other.lost is None
                and (self.status, self.step) == (other.status, other.step))


def supervise(command: Sequence[str], *, max_restarts: int, cluster: ClusterOptions | None,
              checkpoint_dir: str, say: Callable[[str], None], resume_hint: str,
              run: Callable[..., int] | None = None) -> int:
    """Runs `command` until it ends as the job's own (done, bad input, or
    stopped by a signal it saved for), starting it again with `--resume`
    from the newest checkpoint after anything else, at most `max_restarts`
    times.

    Args:
      command: the run's command line (without `--resume`).
      max_restarts: restarts allowed; 0 runs the command once, as it is.
      cluster: the run's cluster, whose tasks are waited for (up to its
        `connect_timeout`) before a restart after a lost worker; None for
        a run on one host.
      checkpoint_dir: where the run's checkpoints are; a restart goes back
        to the newest.
      say: prints one line (a restart, or why the run cannot go on).
      resume_hint: the command that resumes by hand, for the last words.
      run: runs a command line with an environment and returns its exit
        status, negative for a signal (default: `run_child`).

    Returns:
      The exit code to end with: the last run's (128 + the signal's number
      for one killed), or 1 when a lost worker does not come back.
    """
    stopping = []  # a stop of the whole job came in: the run ends, unrestarted
    run = run or functools.partial(run_child, on_stop=stopping.append)
    restarts, resume, previous = 0, False, None
    with tempfile.TemporaryDirectory(prefix="tower-train-") as folder:
        lost_path = os.path.join(folder, "lost.json")
        step_path = os.path.join(folder, "step")
        while True:
            env = {k: v for k, v in os.environ.items() if k not in (LOST_FILE, STEP_FILE)}
            env[STEP_FILE] = step_path
            if restarts < max_restarts:
                env[LOST_FILE] = lost_path
            argv = [*command, *(["--resume"] if resume and "--resume" not in command else [])]
            status = run(argv, env)
            ending = Ending(status, StepReport.read(step_path), _read_lost(lost_path))
            if stopping or status in (0, USAGE_EXIT, *STOP_EXITS) or (
                    status == LOST_EXIT and ending.lost is None):
                return ending.exit_code
            checkpoint = latest_checkpoint(checkpoint_dir)
            if restarts >= max_restarts:
                # A run that exited said its own last words; one that was
                # killed could not.
                if ending.status < 0:
                    say(f"error: {ending.cause()}; no restart left ({max_restarts} used); "
                        + (f"the newest checkpoint is {checkpoint}; resume with: "
                           if checkpoint else "no checkpoint was saved; start again with: ")
                        + resume_hint)
                return ending.exit_code
            if checkpoint is None:
                again = "once every worker is up again, " if ending.lost else ""
                say(f"error: {ending.cause()}, before the first checkpoint: nothing to go "
                    f"back to; {again}start again with: {resume_hint}")
                return 1 if ending.lost else ending.exit_code
            if ending.same_failure(previous):
                say(f"error: {ending.cause()} again, as the run before it: a crash loop, so "
                    f"no restart; the newest checkpoint is {checkpoint}; once the cause is "
                    f"fixed, resume with: {resume_hint}")
                return ending.exit_code
            restarts += 1
            left = max_restarts - restarts
            wait = ending.lost is not None and cluster is not None
            say(f"restart {restarts} of {max_restarts}: {ending.cause()}; going back to "
                f"{checkpoint}"
                + (f" once every task answers (up to {cluster.connect_timeout:g} s)"
                   if wait else "")
                + f"; {left} restart{'s' * (left != 1)} left")
            if wait:
                down = [f"{task} at {address} does not answer ({reason})"
                        for task, address, reason in down_after_timeout(cluster)]
                if down:
                    say(f"error: {'; '.join(down)} after {cluster.connect_timeout:g} s; the "
                        f"last checkpoint is {checkpoint}; once every worker is up again, "
                        f"resume with: {resume_hint}")
                    return 1
            previous, resume = ending, True


def _read_lost(path: str) -> Lost | None:
    """What a run that lost a worker wrote to LOST_FILE (taken away once read)."""
    if not os.path.isfile(path):
        return None
    with open(path) as saved:
        lost = Lost(**{k: tuple(v) if k == "tasks" else v for k, v in json.load(saved).items()})
    os.remove(path)
    return lost


def run_child(argv: Sequence[str], env: dict,
              on_stop: Callable[[int], None] = lambda number: None) -> int:
    """Runs the run's process and returns its exit status (negative: the
    signal that ended it). Ctrl-C reaches it from the terminal, which stops
    it at its next safe point: this process only notes it; SIGTERM to this
    process goes on to it. Either is the job's own stop (`on_stop`)."""
    child = subprocess.Popen(list(argv), env=env)

    def forward(number, frame):
        on_stop(number)
        if number == signal.SIGTERM and child.poll() is None:
            child.send_signal(number)

    before = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
