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
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence

from engine.topology.cluster import ClusterOptions, probe

__all__ = ["LOST_EXIT", "LOST_FILE", "Lost", "report_lost", "supervise"]

# The exit code of a run that lost a worker and may be restarted (EX_TEMPFAIL).
LOST_EXIT = 75
# The environment variable that names where such a run writes what it lost.
LOST_FILE = "TOWER_TRAIN_LOST_FILE"


@dataclasses.dataclass(frozen=True)
class Lost:
    """What a run lost: the tasks (`/job:worker/task:1 at host:port (why)`),
    the last step it finished, and its newest checkpoint (None: none yet)."""

    tasks: tuple[str, ...]
    step: int | None
    checkpoint: str | None


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
              say: Callable[[str], None], resume_hint: str,
              run: Callable[..., int] | None = None) -> int:
    """Runs `command` until it ends other than by losing a worker, starting
    it again with `--resume` after a loss, at most `max_restarts` times.

    Args:
      command: the run's command line (without `--resume`).
      max_restarts: restarts allowed; 0 runs the command once, as it is.
      cluster: the cluster whose tasks are waited for before a restart,
        up to its `connect_timeout`.
      say: prints one line (a restart, or why the run cannot go on).
      resume_hint: the command that resumes by hand, for the last words.
      run: runs a command line with an environment and returns its exit
        code (default: a subprocess that shares this one's terminal).

    Returns:
      The exit code to end with: the last run's, or 1 when a lost worker
      does not come back or no checkpoint was saved yet.
    """
    run = run or (lambda argv, env: subprocess.call(list(argv), env=env))
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
                lost = Lost(**{**json.load(saved)})
            os.remove(lost_path)
            what = "; ".join(lost.tasks)
            at = f" at step {lost.step}" if lost.step is not None else ""
            if lost.checkpoint is None:
                say(f"error: lost {what}{at}, before the first checkpoint: nothing to go "
                    f"back to; once every worker is up again, start again with: "
                    f"{resume_hint}")
                return 1
            restarts += 1
            left = max_restarts - restarts
            say(f"restart {restarts} of {max_restarts}: lost {what}{at}; going back to "
                f"{lost.checkpoint} once every task answers (up to "
                f"{cluster.connect_timeout:g} s); {left} restart{'s' * (left != 1)} left")
            down = wait_for_cluster(cluster)
            if down:
                say(f"error: {'; '.join(down)} after {cluster.connect_timeout:g} s; the last "
                    f"checkpoint is {lost.checkpoint}; once every worker is up again, "
                    f"resume with: {resume_hint}")
                return 1
            resume = True


def wait_for_cluster(cluster: ClusterOptions, poll: float = 0.5) -> list[str]:
    """Waits up to `connect_timeout` for every remote task to accept
    connections; returns `/job:J/task:T at ADDRESS does not answer (why)`
    for those that still do not (empty: all answer)."""
    deadline = time.monotonic() + cluster.connect_timeout
    while True:
        down = []
        for task, address in cluster.remote_tasks():
            reason = probe(address, timeout=min(2.0, cluster.connect_timeout))
            if reason:
                down.append(f"{task} at {address} does not answer ({reason})")
        if not down or time.monotonic() >= deadline:
            return down
        time.sleep(poll)
