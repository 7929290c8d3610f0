"""The supervisor of --max-restarts, on real child processes: what it runs,
when it starts a run again, and when it stops."""

import json
import os
import socket
import sys

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


def test_a_run_ended_by_a_signal_is_said_and_ends_with_128_plus_it(tmp_path):
    folder = checkpoints(tmp_path)
    server, cluster = listening_cluster()
    said = []
    with server:
        code = supervise.supervise(
            [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
            max_restarts=2, cluster=cluster, checkpoint_dir=folder, say=said.append,
            resume_hint="-")
    assert code == 128 + 9
    assert said == ["error: the run's process ended by SIGKILL"]


def test_the_newest_checkpoint_is_read_from_the_state_file(tmp_path):
    folder = checkpoints(tmp_path, "ckpt-30")
    assert supervise.latest_checkpoint(folder) == os.path.join(folder, "ckpt-30")
    assert supervise.latest_checkpoint(str(tmp_path / "none")) is None
