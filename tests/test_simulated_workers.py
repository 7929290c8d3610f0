"""Sixteen workers simulated on one device compute what sixteen devices
would: the exact mean equals one tower fed their batches concatenated,
PowerSGD keeps sixteen residuals that resume bit for bit, and the bytes
each worker sends, counted by the placement log, are the papers' formulas.
Each check runs tests/simulated_workers.py in a process of its own (the CPU
is split into sixteen devices once per process)."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from engine.placement import report

WORKERS = 16
SCRIPT = os.path.join(REPO, "tests", "simulated_workers.py")


def simulate(mode: str, mnist_dir, out) -> None:
    result = subprocess.run([sys.executable, SCRIPT, mode, mnist_dir, str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_sixteen_workers_take_the_step_one_tower_takes_on_their_batches(mnist_dir, tmp_path):
    simulate("mean", mnist_dir, tmp_path)
    weights = np.load(tmp_path / "mean.npz")
    moved = np.abs(weights["sixteen"] - weights["start"]).max()
    assert moved > 1e-3  # three SGD steps moved the weights
    # The same within float32 rounding: a mean of 16 means of 8 against one of 128.
    np.testing.assert_allclose(weights["sixteen"], weights["one"], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_powersgd_keeps_sixteen_residuals_that_resume_bit_for_bit(mnist_dir, tmp_path):
    simulate("powersgd", mnist_dir, tmp_path)
    state = np.load(tmp_path / "powersgd.npz")
    straight, resumed = state["straight"], state["resumed"]
    assert straight.shape[0] == WORKERS
    assert len({tower.tobytes() for tower in straight}) == WORKERS  # each its own
    assert np.abs(straight).max() > 0.01
    np.testing.assert_array_equal(resumed, straight)  # 3 steps, a checkpoint, 2 more
    assert not np.array_equal(state["at_three"], straight)  # and they moved after it


def mlp_shapes() -> list[tuple[int, ...]]:
    from towers import models

    return [tuple(v.shape) for v in models.mlp((28, 28, 1), 10).trainable_variables]


def powersgd_bytes(shapes, rank: int) -> float:
    """Per worker: a ring all-reduce of P [n, r] and Q [m, r] per matrix the
    factors at least halve (n m >= 2 r (n + m)), of the gradient otherwise;
    a ring sends 2 (N - 1) / N x 4 bytes per element from each worker."""
    elements = 0
    for shape in shapes:
        if len(shape) >= 2:
            n, m = math.prod(shape[:-1]), shape[-1]
            if n * m >= 2 * rank * (n + m):
                elements += (n + m) * rank
                continue
        elements += math.prod(shape)
    return 2 * (WORKERS - 1) / WORKERS * 4 * elements


def topk_bytes(shapes, density: float) -> int:
    """Per worker: k = max(1, ceil(density s)) float32 values and int32
    indices per gradient, to each of the N - 1 others."""
    kept = sum(max(1, math.ceil(round(density * math.prod(s), 9))) for s in shapes)
    return (WORKERS - 1) * 8 * kept


@pytest.mark.slow
def test_each_workers_bytes_in_the_placement_log_are_the_formula(mnist_dir, tmp_path):
    simulate("logs", mnist_dir, tmp_path)
    shapes = mlp_shapes()
    # The kernels, [784, 128] and [128, 10], are factored at rank 4 (1,280 >=
    # 2 x 4 x 138); the biases go whole.
    expected = {"powersgd:rank=4": powersgd_bytes(shapes, 4),
                "topk:ratio=0.001": topk_bytes(shapes, 0.001)}
    for reducer, formula in expected.items():
        entries = report.load(str(tmp_path / f"{reducer}.jsonl"))
        sent = {}
        for transfer in report.transfers(entries, "train"):
            if transfer["tensor"].startswith("reduce"):
                sent[transfer["src"]] = sent.get(transfer["src"], 0) + transfer["bytes"]
        assert sorted(sent) == sorted(f"/cpu:{k}" for k in range(WORKERS)), reducer
        per_worker = sum(sent.values()) / WORKERS
        assert per_worker == pytest.approx(formula, rel=1e-12), reducer
        if reducer.startswith("topk"):  # all-gathers: every worker the same
            assert set(sent.values()) == {formula}, reducer


def test_towers_that_share_a_device_are_named_as_simulated():
    from engine.topology.devices import Placement, Tower

    def placement(*devices, physical=None):
        return Placement(tuple(Tower(k, d, len(devices), physical) for k, d in enumerate(devices)),
                         "/cpu:0")

    assert placement("/cpu:0", "/cpu:1", "/cpu:2").simulated() == [("this host's CPU", 3)]
    assert placement("/cpu:0").simulated() == []
    assert placement("/gpu:0", "/gpu:1").simulated() == []  # two real GPUs
    assert placement("/gpu:0", "/gpu:1", physical=0).simulated() == [("this host's GPU 0", 2)]
    assert placement("/job:worker/task:1/cpu:0", "/job:worker/task:1/cpu:1",
                     "/job:worker/task:2/cpu:0").simulated() == [
        ("/job:worker/task:1's CPU", 2)]
