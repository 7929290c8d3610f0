"""Behaviour kept through redesigns: a fixed-seed deterministic run of each
built-in reducer gives, bit for bit, the per-epoch losses, placement-log
bytes and checkpoint tensors recorded from main before the run's plan was
redesigned (tests/data/determinism.json; tests/determinism.py makes them).
A change that means to move these figures re-records them, and says why in
its commit. They hold for the package versions they were recorded with
(`_environment`)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = os.path.join(REPO, "tests", "determinism.py")
RECORDED = os.path.join(REPO, "tests", "data", "determinism.json")


@pytest.mark.slow
def test_every_builtin_reducer_gives_the_figures_recorded_before_the_redesign(mnist_dir,
                                                                             tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run([sys.executable, SCRIPT, mnist_dir, str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(RECORDED) as f:
        recorded = json.load(f)
    with open(out) as f:
        now = json.load(f)
    # Figures of another environment say nothing about the code: re-record
    # them from main before the redesign (eaac363) in this one.
    assert now.pop("_environment") == recorded.pop("_environment"), (
        "the figures were recorded with other packages; re-record them from eaac363 "
        "(python tests/determinism.py MNIST_DIR tests/data/determinism.json)")
    assert sorted(now) == sorted(recorded)
    for name in recorded:
        assert now[name]["losses"] == recorded[name]["losses"], name
        assert now[name]["bytes"] == recorded[name]["bytes"], name
        assert now[name]["checkpoint"] == recorded[name]["checkpoint"], name
