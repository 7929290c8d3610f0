"""A disk that fills up mid-run: one line that says what was needed and what
is kept, nothing half-written left behind, and a resume that goes on exactly
once there is room again. Each test mounts a small tmpfs (skipped, with the
reason, where this process may not mount one)."""

import contextlib
import os
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_cli
from test_cluster import model_values


@contextlib.contextmanager
def tmpfs(path, size: str):
    """A tmpfs of `size` (`1800k`) mounted at `path` for the block."""
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path) -> None:
    """Fills the disk of `path` to its last byte."""
    with contextlib.suppress(OSError), open(os.path.join(path, "filler"), "wb") as out:
        while True:
            out.write(b"\0" * 4096)
            out.flush()


def run(mnist_dir, folder, *extra: str) -> list[str]:
    """60 deterministic steps of the mlp on cpu:2, a checkpoint every 20."""
    folder.mkdir(exist_ok=True)
    return ["tower-train", "--devices", "cpu:2", "--data", mnist_dir, "--epochs", "1",
            "--steps-per-epoch", "60", "--eval-steps", "0", "--deterministic",
            "--checkpoint-dir", str(folder / "ckpt"), "--checkpoint-every", "20",
            "--save-model", str(folder / "model.keras"), *extra]


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_is_one_line_and_the_resume_goes_on_exactly(
        mnist_dir, tmp_path):
    """Room for one checkpoint and a half: ckpt-20 fits, ckpt-40 does not."""
    whole = run_cli(*run(mnist_dir, tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    disk = tmp_path / "disk"
    with tmpfs(disk, "1800k"):
        args = run(mnist_dir, disk)
        full = run_cli(*args)
        assert full.returncode == 1, full.stderr
        last = full.stderr.strip().splitlines()[-1]
        assert re.fullmatch(
            rf"tower-train: error: --checkpoint-dir '{disk}/ckpt' is full: checkpoint ckpt-40 "
            r"needs about 1\.2 MB, with \d+\.\d KB free there; the newest complete checkpoint, "
            rf"{disk}/ckpt/ckpt-20, is kept, and nothing half-written is left; free some space "
            r"there \(or give another --checkpoint-dir, or fewer --keep-checkpoints\), then "
            r"resume with: .venv/bin/tower-train --devices cpu:2 .* --resume", last), last
        assert sorted(os.listdir(disk / "ckpt")) == [
            "checkpoint", "ckpt-20.data-00000-of-00001", "ckpt-20.index"]
        assert tf.train.latest_checkpoint(str(disk / "ckpt")) == f"{disk}/ckpt/ckpt-20"
        assert tf.train.load_checkpoint(f"{disk}/ckpt/ckpt-20").get_tensor(
            "global_step/.ATTRIBUTES/VARIABLE_VALUE") == 20

        subprocess.run(["mount", "-o", "remount,size=10m", str(disk)], check=True)
        resumed = run_cli(*args, "--resume")
        assert resumed.returncode == 0, resumed.stderr
        assert f"resumed from {disk}/ckpt/ckpt-20 at step 20" in resumed.stdout
        for got, want in zip(model_values(disk / "model.keras"),
                             model_values(tmp_path / "whole" / "model.keras"), strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("flag, name, what", [
    ("--metrics", "m.jsonl", "the epoch's line"),
    ("--logdir", "tb", "the TensorBoard event file"),
])
def test_a_full_disk_under_the_metrics_or_tensorboard_is_one_line(tmp_path, flag, name, what):
    disk = tmp_path / "disk"
    with tmpfs(disk, "64k"):
        fill(disk)
        result = run_cli("tower-train", "--devices", "cpu:1", "--data-format", "synthetic",
                         "--epochs", "1", "--steps-per-epoch", "3", "--eval-steps", "0",
                         flag, str(disk / name))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"tower-train: error: {flag} '{disk}/{name}' is full: {what} was not written, with 0 "
        f"bytes free there; free some space there (or give another {flag})")
