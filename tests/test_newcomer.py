"""The small things a newcomer trips on, each with the message it now gets:
`-h` on every command, a passing reducer check that says so, one reduce
device in training and in its check, a resume command that runs where it is
printed, a repeated flag refused, a group larger than the run refused, and
`--devices all` saying why it chose CPU towers."""

from __future__ import annotations

import os
import re
import sys

import pytest
from conftest import BIN, GPUS, REPO, run_cli

import towers
from towers.cli import common

COMMANDS = ["tower-train", "tower-compare", "tower-data", "tower-placement",
            "tower-reduce-bench", "tower-worker"]


@pytest.mark.parametrize("command", [*COMMANDS, "tower-data mnist", "tower-placement check"])
def test_dash_h_is_help_on_every_command(command):
    short = run_cli(*command.split(), "-h")
    long = run_cli(*command.split(), "--help")
    assert short.returncode == long.returncode == 0, short.stderr
    assert short.stdout == long.stdout
    assert short.stdout.startswith(f"Usage: {command} [OPTIONS]")
    assert "-h, --help" in short.stdout


def test_mixed_precision_help_names_auto():
    out = run_cli("tower-train", "-h").stdout
    assert "--mixed-precision [auto|bfloat16|float16]" in out
    assert "Alone or 'auto': compute in float16 on GPU" in " ".join(out.split())


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "64", "--epochs", "1", "--batch-size", "128"],
     "--batch-size 64 and --batch-size 128 are both given; give --batch-size once"),
    (["--lr=0.1", "--lr", "0.2"], "--lr 0.1 and --lr 0.2 are both given; give --lr once"),
    (["--xla", "--no-xla"], "--xla and --no-xla are both given; give one of them"),
    (["--mixed-precision", "--mixed-precision", "bfloat16"],
     "--mixed-precision and --mixed-precision bfloat16 are both given; give --mixed-precision "
     "once"),
])
def test_a_flag_given_twice_is_refused(args, message, capsys):
    from towers.cli.train import tower_train

    with pytest.raises(SystemExit) as ended:
        tower_train.main(args, prog_name="tower-train")
    assert ended.value.code == 2
    assert capsys.readouterr().err == f"tower-train: error: {message}\n"


def test_a_repeatable_flag_may_repeat():
    from towers.cli.compare import tower_compare

    common.refuse_repeats(tower_compare, ["--reducer", "central", "--reducer", "ring"])


def test_group_size_is_refused_where_it_means_nothing():
    with pytest.raises(towers.UsageError) as err:
        towers.Trainer("cpu:2", group_size=3)
    assert str(err.value) == ("group_size=3 sets the groups of reducer='hierarchical'; "
                              "reducer='central' does not group towers: drop group_size")


def test_a_group_larger_than_the_run_is_refused():
    with pytest.raises(towers.UsageError) as err:
        towers.Trainer(["/cpu:0", "/cpu:1"], reducer="hierarchical", group_size=3,
                       data=towers.data.synthetic())
    assert str(err.value) == "group_size (3) is more than the run's 2 towers; give 1 to 2"


@pytest.mark.parametrize("argv0, on_path, expected", [
    # An activated environment: the shell finds this very program by name.
    ("{bin}/tower-train", True, "tower-train"),
    # Not activated, run from the repository as the README does.
    ("{bin}/tower-train", False, ".venv/bin/tower-train"),
    # Run by a path outside the working folder: that path, whole.
    ("/opt/env/bin/tower-train", False, "/opt/env/bin/tower-train"),
    # Not the command itself (python -m, a test): its name.
    ("/usr/lib/python3/site-packages/towers/cli/train.py", False, "tower-train"),
])
def test_the_resume_command_starts_as_the_program_was_called(argv0, on_path, expected,
                                                             monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", [argv0.format(bin=BIN), "--devices", "cpu:2"])
    monkeypatch.setenv("PATH", BIN if on_path else "/usr/bin:/bin")
    assert common.program("tower-train") == expected
    # A sibling command, as a message names it (the placement log's summary).
    assert common.program("tower-placement") == expected.replace("tower-train",
                                                                   "tower-placement")


@pytest.mark.slow  # two processes that start TensorFlow
def test_devices_all_says_why_it_chose_cpu_towers_and_the_check_says_it_passed():
    if GPUS:
        pytest.skip("this host has a GPU: 'all' means its GPUs")
    result = run_cli("tower-train", "--devices", "all", "--epochs", "1", "--steps-per-epoch",
                     "2", "--eval-steps", "1", "--check-reducer")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    cores = len(os.sched_getaffinity(0))
    assert lines[1] == (f"tower-train: devices 'all': TensorFlow sees no GPU here, so {cores} "
                        "CPU towers, one per core ('cpu:N' sets another count)")
    checked = [line for line in lines if "reducer check" in line]
    assert checked == ["tower-train: reducer check passed: 'central' gives the exact mean of 4 "
                       f"gradients shaped as the model's, on {cores} towers, within float32 "
                       "rounding"]
    check = run_cli("tower-reduce-bench", "--check", "central", "--devices", "cpu:2")
    assert check.returncode == 0, check.stderr
    assert re.match(r"checking central: towers on /cpu:0, /cpu:1, reduce device /cpu:0,",
                    check.stdout + check.stderr), check.stdout + check.stderr
    # Training's header names the same reduce device.
    assert "  reduce   /cpu:0   variables" in result.stdout
