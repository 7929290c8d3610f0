"""The supervisor of --max-restarts, on real child processes: what it runs,
when it starts a run again, and when it stops."""

import json
import os
import socket
import sys

import pytest

from engine.run import supervise
from engine.topology.cluster import ClusterOptions

# A child that loses a worker (writes what it lost and exits LOST_EXIT) its
# first `losses` runs, then exits 0 (3 when it may no longer be restarted
# and still loses one); it appends its argv to a file.
CHILD = """
import json, os, sys
with open(sys.argv[1], "a") as log:
    log.write(json.dumps([sys.argv[2:], os.environ.get("{LOST_FILE}")]) + "\\n")
runs = sum(1 for _ in open(sys.argv[1]))
if os.environ.get("{LOST_FILE}") and runs <= int(sys.argv[2]):
    with open(os.environ["{LOST_FILE}"], "w") as out:
        json.dump({{"tasks": ["/job:worker/task:1 at 127.0.0.1:9 (Connection refused)"],
                   "step": 10 * runs}}, out)
    sys.exit({LOST_EXIT})
sys.exit(3 if os.environ.get("{LOST_FILE}") is None and runs <= int(sys.argv[2]) else 0)
""".format(LOST_FILE=supervise.LOST_FILE, LOST_EXIT=supervise.LOST_EXIT)


def listening_cluster():
    """A cluster of one worker address that accepts connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server, ClusterOptions((("worker", (f"127.0.0.1:{server.getsockname()[1]}",)),),
                                  connect_timeout=2.0)


def checkpoints(tmp_path, name: str | None = "ckpt-10"):
    """A checkpoint folder whose state file lists `name` (None: no state file)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    if name:
        (folder / "checkpoint").write_text(
            f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    return str(folder)


def run_supervised(tmp_path, losses: int, max_restarts: int):
    folder = checkpoints(tmp_path)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    log = tmp_path / "runs.jsonl"
    said = []
    server, cluster = listening_cluster()
    with server:
        code = supervise.supervise(
            [sys.executable, str(script), str(log), str(losses)],
            max_restarts=max_restarts, cluster=cluster, checkpoint_dir=folder, say=said.append,
            resume_hint="tower-train ... --resume")
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    return code, said, runs


def test_each_loss_is_a_restart_with_resume_until_the_run_ends(tmp_path):
    code, said, runs = run_supervised(tmp_path, losses=2, max_restarts=3)
    assert code == 0
    assert [args[1:] for args, _ in runs] == [[], ["--resume"], ["--resume"]]
    assert all(lost_file for _, lost_file in runs)  # every run may still be restarted
    folder = tmp_path / "ckpt"
    assert said == [
        f"restart 1 of 3: lost /job:worker/task:1 at 127.0.0.1:9 (Connection refused) at step "
        f"10; going back to {folder}/ckpt-10 once every task answers (up to 2 s); 2 restarts left",
        "restart 2 of 3: lost /job:worker/task:1 at 127.0.0.1:9 (Connection refused) at step "
        f"20; going back to {folder}/ckpt-10 once every task answers (up to 2 s); 1 restart left",
    ]


def test_the_last_allowed_run_is_unsupervised_and_its_exit_code_is_the_end(tmp_path):
    code, said, runs = run_supervised(tmp_path, losses=5, max_restarts=1)
    # The second run may not be restarted: it runs as without --max-restarts,
    # and ends as such a run does (this child: exit 3).
    assert code == 3
    assert [lost_file is None for _, lost_file in runs] == [False, True]
    assert len(said) == 1 and said[0].startswith("restart 1 of 1: ")


def test_max_restarts_0_runs_the_command_once_as_it_is(tmp_path):
    code, said, runs = run_supervised(tmp_path, losses=1, max_restarts=0)
    assert (code, said) == (3, [])
    assert runs == [[runs[0][0], None]]


def test_a_loss_before_the_first_checkpoint_stops_with_the_command(tmp_path):
    folder = checkpoints(tmp_path, None)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    server, cluster = listening_cluster()
    said = []
    with server:
        code = supervise.supervise(
            [sys.executable, str(script), str(tmp_path / "log"), "1"], max_restarts=2,
            cluster=cluster, checkpoint_dir=folder, say=said.append,
            resume_hint="tower-train --cluster ...")
    assert code == 1
    assert said == ["error: lost /job:worker/task:1 at 127.0.0.1:9 (Connection refused) at "
                    "step 10, before the first checkpoint: nothing to go back to; once every "
                    "worker is up again, start again with: tower-train --cluster ..."]


# A child that does, on its k-th run, the k-th of the actions in argv[2] (a
# JSON list; the last repeats): "kill:STEP" reports STEP, then SIGKILLs
# itself; "exit:CODE:STEP" reports STEP and exits with CODE; "term:CODE"
# waits for SIGTERM and exits with CODE. It appends its argv to argv[1].
ACTOR = """
import json, os, signal, sys, time
with open(sys.argv[1], "a") as log:
    log.write(json.dumps([sys.argv[3:], os.environ.get("{LOST_FILE}")]) + "\\n")
runs = sum(1 for _ in open(sys.argv[1]))
actions = json.loads(sys.argv[2])
kind, *rest = actions[min(runs, len(actions)) - 1].split(":")
def report(step):
    with open(os.environ["{STEP_FILE}"], "w") as out:
        out.write(f"{{int(step):>20}}\\n")
if kind == "kill":
    report(rest[0])
    os.kill(os.getpid(), signal.SIGKILL)
if kind == "exit":
    report(rest[1])
    sys.exit(int(rest[0]))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(rest[0])))
print("waiting", flush=True)
time.sleep(60)
""".format(LOST_FILE=supervise.LOST_FILE, STEP_FILE=supervise.STEP_FILE)


def act(tmp_path, actions: list[str], max_restarts: int = 2, checkpoint: str | None = "ckpt-10",
        during=None):
    """Supervises ACTOR doing `actions` on one host; returns (exit code,
    lines said, each run's arguments). `during(tmp_path)` runs in a thread
    while the supervisor waits."""
    import threading

    folder = checkpoints(tmp_path, checkpoint)
    script = tmp_path / "actor.py"
    script.write_text(ACTOR)
    log = tmp_path / "runs.jsonl"
    said = []
    helper = threading.Thread(target=during, args=(tmp_path,)) if during else None
    if helper:
        helper.start()
    code = supervise.supervise(
        [sys.executable, str(script), str(log), json.dumps(actions)],
        max_restarts=max_restarts, cluster=None, checkpoint_dir=folder, say=said.append,
        resume_hint="tower-train --devices cpu:2 --resume")
    if helper:
        helper.join()
    return code, said, [args for args, _ in map(json.loads, log.read_text().splitlines())]


def test_a_killed_run_on_one_host_is_a_restart_that_names_the_signal_and_step(tmp_path):
    code, said, runs = act(tmp_path, ["kill:12", "exit:0:30"])
    assert code == 0
    assert runs == [[], ["--resume"]]
    assert said == [f"restart 1 of 2: the run's process ended by SIGKILL at step 12; going "
                    f"back to {tmp_path}/ckpt/ckpt-10; 1 restart left"]


def test_a_failed_run_is_a_restart_too_and_a_crash_loop_ends_after_the_second(tmp_path):
    # Exit 1 at step 12 each time: the same failure at the same step twice.
    code, said, runs = act(tmp_path, ["exit:1:12"], max_restarts=5)
    assert code == 1
    assert runs == [[], ["--resume"]]
    assert said == [
        f"restart 1 of 5: the run's process exited with 1 at step 12; going back to "
        f"{tmp_path}/ckpt/ckpt-10; 4 restarts left",
        f"error: the run's process exited with 1 at step 12 again, as the run before it: a "
        f"crash loop, so no restart; the newest checkpoint is {tmp_path}/ckpt/ckpt-10; once "
        f"the cause is fixed, resume with: tower-train --devices cpu:2 --resume",
    ]


def test_crashes_at_other_steps_restart_until_none_is_left(tmp_path):
    code, said, runs = act(tmp_path, ["kill:12", "kill:17", "kill:23"], max_restarts=2)
    assert code == 128 + 9
    assert len(runs) == 3
    assert [line.split(";")[0] for line in said] == [
        "restart 1 of 2: the run's process ended by SIGKILL at step 12",
        "restart 2 of 2: the run's process ended by SIGKILL at step 17",
        "error: the run's process ended by SIGKILL at step 23"]
    assert said[-1].endswith(f"no restart left (2 used); the newest checkpoint is "
                             f"{tmp_path}/ckpt/ckpt-10; resume with: tower-train --devices "
                             f"cpu:2 --resume")


def test_a_crash_before_the_first_checkpoint_ends_with_the_command(tmp_path):
    code, said, runs = act(tmp_path, ["kill:3"], checkpoint=None)
    assert (code, len(runs)) == (128 + 9, 1)
    assert said == ["error: the run's process ended by SIGKILL at step 3, before the first "
                    "checkpoint: nothing to go back to; start again with: tower-train "
                    "--devices cpu:2 --resume"]


@pytest.mark.parametrize("code", [0, 2, 130, 143])
def test_the_jobs_own_endings_are_not_restarted(tmp_path, code):
    # Done, bad input, Ctrl-C and SIGTERM (each saved first): never restarted.
    assert act(tmp_path, [f"exit:{code}:12", "exit:0:30"]) == (code, [], [[]])


@pytest.mark.parametrize("child_code", [143, 1])
def test_sigterm_to_the_supervisor_reaches_the_run_and_is_its_stop(tmp_path, child_code):
    """What the run does with SIGTERM is its own stop, however it ends."""
    import signal
    import time

    def terminate(folder):
        log = folder / "runs.jsonl"
        deadline = time.monotonic() + 30
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the child's handler is in place
        os.kill(os.getpid(), signal.SIGTERM)

    assert act(tmp_path, [f"term:{child_code}", "exit:0:30"], during=terminate) == (
        child_code, [], [[]])


def test_the_newest_checkpoint_is_read_from_the_state_file(tmp_path):
    folder = checkpoints(tmp_path, "ckpt-30")
    assert supervise.latest_checkpoint(folder) == os.path.join(folder, "ckpt-30")
    assert supervise.latest_checkpoint(str(tmp_path / "none")) is None


def one_host(mnist_dir, folder, *extra: str) -> list[str]:
    """A deterministic run of 2 epochs of 100 steps on cpu:2 under
    --max-restarts 2 that writes every kind of record into `folder`."""
    folder.mkdir(exist_ok=True)
    return ["tower-train", "--devices", "cpu:2", "--data", mnist_dir, "--epochs", "2",
            "--steps-per-epoch", "100", "--eval-steps", "2", "--deterministic",
            "--max-restarts", "2", "--checkpoint-dir", str(folder / "ckpt"),
            "--checkpoint-every", "20", "--metrics", str(folder / "metrics.jsonl"),
            "--logdir", str(folder / "tb"), "--save-model", str(folder / "model.keras"),
            *extra]


@pytest.fixture(scope="module")
def uninterrupted(mnist_dir, tmp_path_factory):
    """The records and weights of `one_host` when nothing goes wrong."""
    from conftest import run_cli
    from test_cluster import model_values, read_metrics

    folder = tmp_path_factory.mktemp("whole")
    whole = run_cli(*one_host(mnist_dir, folder))
    assert whole.returncode == 0, whole.stderr
    assert "restart" not in whole.stdout + whole.stderr
    return read_metrics(folder / "metrics.jsonl"), model_values(folder / "model.keras")


def the_run_of(supervisor) -> int:
    """The pid of the training process a supervisor started (its one child)."""
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children") as listed:
            children = listed.read().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError("the supervisor started no run")


def assert_as_uninterrupted(folder, uninterrupted) -> None:
    """Each epoch and each step once, with the figures and the final weights
    of the run that lost nothing."""
    import numpy as np
    from test_cluster import FIGURES, event_steps, model_values, read_metrics

    baseline, weights = uninterrupted
    records = read_metrics(folder / "metrics.jsonl")
    assert [[r[k] for k in FIGURES] for r in records] == [
        [r[k] for k in FIGURES] for r in baseline]
    assert event_steps(folder / "tb", "train/loss") == list(range(1, 201))
    for got, want in zip(model_values(folder / "model.keras"), weights, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_a_killed_training_process_on_one_host_is_restarted_and_ends_as_if_not(
        mnist_dir, tmp_path, uninterrupted):
    """--max-restarts without a cluster: the training process SIGKILLed (as
    the OOM killer would) after its first checkpoint; the supervisor says so
    and starts it again from that checkpoint, and the run ends with the
    records and weights of a run that was never killed."""
    import os
    import re
    import signal
    import subprocess

    from conftest import BIN, REPO
    from test_cluster import wait_for_checkpoint

    folder = tmp_path / "killed"
    args = one_host(mnist_dir, folder)
    run = subprocess.Popen([os.path.join(BIN, args[0]), *args[1:]], cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        child = the_run_of(run)
        wait_for_checkpoint(run, folder / "ckpt", 20)
        os.kill(child, signal.SIGKILL)
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, err
    restarts = re.findall(r"^tower-train: restart .*$", out, re.M)
    assert len(restarts) == 1, out
    assert re.fullmatch(
        rf"tower-train: restart 1 of 2: the run's process ended by SIGKILL at step (\d+); "
        rf"going back to {folder}/ckpt/ckpt-(\d+); 1 restart left", restarts[0]), restarts[0]
    step, saved = (int(x) for x in re.search(r"step (\d+);.*ckpt-(\d+);", restarts[0]).groups())
    assert 20 <= saved <= step
    assert f"resumed from {folder}/ckpt/ckpt-{saved} at step {saved}" in out
    assert_as_uninterrupted(folder, uninterrupted)


@pytest.mark.slow
def test_sigterm_under_the_supervisor_saves_at_that_step_and_is_not_restarted(
        mnist_dir, tmp_path, uninterrupted):
    """A preemption: SIGTERM to the job mid-epoch finishes the step, saves
    a checkpoint at it and exits 143, unrestarted; the run resumed by hand
    (as a scheduler would) ends as one that was never stopped."""
    import os
    import re
    import signal
    import subprocess

    from conftest import BIN, REPO, run_cli
    from test_cluster import wait_for_checkpoint

    folder = tmp_path / "stopped"
    args = one_host(mnist_dir, folder)
    run = subprocess.Popen([os.path.join(BIN, args[0]), *args[1:]], cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_checkpoint(run, folder / "ckpt", 20)
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 143, err
    assert "restart" not in out + err
    stopped = re.search(r"^tower-train: stopped by SIGTERM after step (\d+); checkpoint "
                        rf"saved: {folder}/ckpt/ckpt-(\d+); resume with: .* --resume$",
                        err, re.M)
    assert stopped, err
    step, saved = (int(x) for x in stopped.groups())
    assert step == saved and step % 100 and step >= 20  # mid-epoch, at the step it stopped
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {folder}/ckpt/ckpt-{saved} at step {saved}" in resumed.stdout
    assert_as_uninterrupted(folder, uninterrupted)
