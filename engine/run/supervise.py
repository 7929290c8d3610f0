"""Supervised restarts: a run on a cluster that loses a worker comes back by
itself, from its last checkpoint, up to a number of times.

The run is a child process (a `tower-train` command line). When it loses a
worker (a task stops answering, or a step outlives `step_timeout`) and the
supervisor allows another restart, it writes what it lost to the file named
by LOST_FILE and exits with LOST_EXIT. The supervisor then waits for every
task of the cluster to answer again, up to `connect_timeout`, and starts the
command again with `--resume`: a new process, which connects to the cluster
on TensorFlow's own runtime, builds the towers again and restores the
checkpoint, as torchrun restarts its workers. The last allowed attempt runs
without LOST_FILE, so a loss past the limit ends as an unsupervised run
does: one line and the resume command.

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

__all__ = ["LOST_EXIT", "LOST_FILE", "Lost", "latest_checkpoint", "report_lost", "run_child",
           "supervise"]

# The exit code of a run that lost a worker and may be restarted (EX_TEMPFAIL).
LOST_EXIT = 75
# The environment variable that names where such a run writes what it lost.
LOST_FILE = "TOWER_TRAIN_LOST_FILE"


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


def supervise(command: Sequence[str], *, max_restarts: int, cluster: ClusterOptions,
              checkpoint_dir: str, say: Callable[[str], None], resume_hint: str,
              run: Callable[..., int] | None = None) -> int:
    """Runs `command` until it ends other than by losing a worker, starting
    it again with `--resume` after a loss, at most `max_restarts` times.

    Args:
      command: the run's command line (without `--resume`).
      max_restarts: restarts allowed; 0 runs the command once, as it is.
      cluster: the cluster whose tasks are waited for before a restart,
        up to its `connect_timeout`.
      checkpoint_dir: where the run's checkpoints are; a restart goes back
        to the newest.
      say: prints one line (a restart, or why the run cannot go on).
      resume_hint: the command that resumes by hand, for the last words.
      run: runs a command line with an environment and returns its exit
        code (default: `run_child`).

    Returns:
      The exit code to end with: the last run's, or 1 when a lost worker
      does not come back or no checkpoint was saved yet.
    """
    run = run or functools.partial(run_child, say=say)
    restarts, resume = 0, False
    with tempfile.TemporaryDirectory(prefix="tower-train-") as folder:
        lost_path = os.path.join(folder, "lost.json")
        while True:
            env = dict(os.environ)
            env.pop(LOST_FILE, None)
            if restarts < max_restarts:
                env[LOST_FILE] = lost_path
            argv = [*command, *(["--resume"] if resume and "--resume" not in command else [])]
            code = run(argv, env)
            if code != LOST_EXIT or not os.path.isfile(lost_path):
                return code
            with open(lost_path) as saved:
                lost = Lost(**json.load(saved))
            os.remove(lost_path)
            what = "; ".join(lost.tasks)
            at = f" at step {lost.step}" if lost.step is not None else ""
            checkpoint = latest_checkpoint(checkpoint_dir)
            if checkpoint is None:
                say(f"error: lost {what}{at}, before the first checkpoint: nothing to go "
                    f"back to; once every worker is up again, start again with: "
                    f"{resume_hint}")
                return 1
            restarts += 1
            left = max_restarts - restarts
            say(f"restart {restarts} of {max_restarts}: lost {what}{at}; going back to "
                f"{checkpoint} once every task answers (up to "
                f"{cluster.connect_timeout:g} s); {left} restart{'s' * (left != 1)} left")
            down = [f"{task} at {address} does not answer ({reason})"
                    for task, address, reason in down_after_timeout(cluster)]
            if down:
                say(f"error: {'; '.join(down)} after {cluster.connect_timeout:g} s; the last "
                    f"checkpoint is {checkpoint}; once every worker is up again, "
                    f"resume with: {resume_hint}")
                return 1
            resume = True


def run_child(argv: Sequence[str], env: dict, say: Callable[[str], None]) -> int:
    """Runs the run's process and returns its exit code. Ctrl-C reaches it
    from the terminal, which stops it at its next safe point: this process
    ignores it meanwhile; SIGTERM to this process goes on to it. A child
    ended by a signal ends this with 128 + the signal's number, said."""
    child = subprocess.Popen(list(argv), env=env)

    def forward(number, frame):
        if child.poll() is None:
            child.send_signal(number)

    before = {sig: signal.signal(sig, handler) for sig, handler in
              ((signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, forward))}
    try:
        code = child.wait()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if code < 0:
        name = signal.Signals(-code).name
        say(f"error: the run's process ended by {name}")
        return 128 - code
    return code
