"""Training that never loses work: kill, interrupt, damaged checkpoints, NaN, determinism."""

import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import BIN, REPO, needs_gpu, run_cli

# Towers of the kill/resume and signal tests: two CPU towers, and on a GPU
# host two logical GPUs of GPU 0, whose readers are replayed at resume.
TOWERS = ["cpu:2", pytest.param("gpu:2", marks=needs_gpu)]


def train_args(data_dir, checkpoint_dir, *extra, devices="cpu:2"):
    return ["--devices", devices, "--data", data_dir, "--epochs", "2",
            "--steps-per-epoch", "40", "--eval-steps", "3", "--checkpoint-dir",
            str(checkpoint_dir), "--checkpoint-every", "10", "--keep-checkpoints", "10",
            "--deterministic", *extra]


def state(path):
    """Every saved tensor but the data iterators' opaque state, by key."""
    reader = tf.train.load_checkpoint(str(path))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if "train_data" not in k and "held_out/" not in k and "CHECKPOINTABLE" not in k}


def start(*args):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.Popen([os.path.join(BIN, "tower-train"), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(directory, name, process, timeout=120):
    deadline = time.monotonic() + timeout
    state_file = directory / "checkpoint"
    while time.monotonic() < deadline:
        if state_file.exists() and f'"{name}"' in state_file.read_text():
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.005)
    raise AssertionError(f"no {name} in {directory} after {timeout} s")


# Stateful reducers: their residuals and PowerSGD's factors must resume too.
# PowerSGD keeps both kinds of state (error-feedback residuals, as topk and
# signsgd do, and its warm factors), so it stands for all of them here; the
# others' resume is checked in-process (tests/test_stateful.py).
STATEFUL = ["--variables", "replicated", "--reducer"]


@pytest.mark.slow
@pytest.mark.parametrize("devices, reducer", [
    ("cpu:2", []), pytest.param("gpu:2", [], marks=needs_gpu),
    ("cpu:2", [*STATEFUL, "powersgd"]),
])
def test_sigkill_mid_epoch_then_resume_gives_the_uninterrupted_weights(
    mnist_dir, tmp_path, devices, reducer
):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    result = run_cli("tower-train", *train_args(mnist_dir, whole, *reducer, devices=devices))
    assert result.returncode == 0, result.stderr

    process = start(*train_args(mnist_dir, killed, *reducer, devices=devices))
    wait_for_checkpoint(killed, "ckpt-50", process)  # step 50 of 80: mid epoch 2
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL

    resumed = run_cli("tower-train", *train_args(mnist_dir, killed, *reducer, devices=devices),
                      "--resume")
    assert resumed.returncode == 0, resumed.stderr
    line = next(l for l in resumed.stdout.splitlines() if l.startswith("resumed from"))
    step = int(re.search(r"ckpt-(\d+) at step (\d+)", line).group(2))
    assert line.startswith(f"resumed from {killed}/ckpt-{step} at step {step}")
    if devices.startswith("gpu"):
        # Every step took a batch; epoch 1's evaluation (after step 40) took 3.
        batches = step + 3
        assert line.endswith(f"; GPU towers 0, 1 replayed {batches:,} batches to that data "
                             "position (DALI cannot save a GPU pipeline's position)")
    expected, got = state(whole / "ckpt-80"), state(killed / "ckpt-80")
    assert expected.keys() == got.keys() and len(expected) > 10
    if reducer:  # a residual per tower and gradient; PowerSGD's Q per tower and kernel
        held = [k for k in expected if k.startswith("reducer/")]
        assert len(held) == (2 * 4 + 2 * 2 if reducer[-1] == "powersgd" else 2 * 4), held
        # At least the kernels' residuals hold something (PowerSGD sends the
        # biases whole: theirs stay zero).
        assert sum(np.abs(expected[k]).max() > 0 for k in held) >= 2 * 2
    for key in expected:  # bit for bit: variables, Adam slots, dropout seeds, counters
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code, devices",
    [(signal.SIGINT, 130, "cpu:2"), (signal.SIGTERM, 143, "cpu:2"),
     pytest.param(signal.SIGINT, 130, "0", marks=needs_gpu)],
)
def test_a_signal_finishes_the_step_saves_and_says_how_to_resume(tmp_path, signum, code,
                                                                  devices):
    directory = tmp_path / "ck"
    args = ["--devices", devices, "--data-format", "synthetic", "--epochs", "1",
            "--steps-per-epoch", "100000", "--checkpoint-dir", str(directory)]
    process = start(*args)
    for line in process.stdout:  # training has begun
        if line.startswith("Epoch 1/1"):
            break
    time.sleep(2)
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == code
    name = signal.Signals(signum).name
    last = err.strip().splitlines()[-1]
    prefix = f"tower-train: stopped by {name} after step "
    assert last.startswith(prefix), err
    step = int(last[len(prefix):].split(";")[0])
    assert step > 0
    assert last == (
        f"{prefix}{step}; checkpoint saved: {directory}/ckpt-{step}; resume with: "
        f".venv/bin/tower-train {' '.join(args)} --resume"
    )
    assert state(directory / f"ckpt-{step}")["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == step


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    directory = tmp_path / "ck"
    args = ["--devices", "cpu:2", "--data-format", "synthetic", "--steps-per-epoch", "5",
            "--checkpoint-dir", str(directory)]
    assert run_cli("tower-train", *args, "--epochs", "2").returncode == 0
    newest = directory / "ckpt-10.data-00000-of-00001"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as by a full disk

    result = run_cli("tower-train", *args, "--epochs", "3", "--resume")
    assert result.returncode == 0, result.stderr
    # tower-train names itself on its warnings as on its errors.
    warning = next(l for l in result.stdout.splitlines() if l.startswith("tower-train: warning:"))
    assert warning.startswith(
        f"tower-train: warning: checkpoint {directory}/ckpt-10 cannot be restored (")
    assert warning.endswith("); trying an older one")
    assert f"resumed from {directory}/ckpt-5 at step 5" in result.stdout
    assert "Epoch 2/3" in result.stdout and "Epoch 1/3" not in result.stdout
    assert (directory / "ckpt-15.index").exists()


@pytest.mark.slow
@pytest.mark.parametrize("per_loop", ["1", "4"])
def test_nan_stops_the_run_naming_step_and_tower_and_keeps_the_last_good_checkpoint(
    tmp_path, per_loop
):
    directory = tmp_path / "ck"
    args = ["--devices", "cpu:2", "--data-format", "synthetic", "--epochs", "1",
            "--steps-per-epoch", "8", "--model", "tests.user_models:nan_on_tower_1_at_step_6",
            "--checkpoint-dir", str(directory), "--checkpoint-every", "4",
            "--steps-per-loop", per_loop]
    result = run_cli("tower-train", *args)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "tower-train: error: step 6: the loss or a gradient of tower 1 (/cpu:1) is not "
        f"finite; the update was not applied; the last good checkpoint is {directory}/ckpt-4; "
        "go on from it, skipping such steps, with: "
        f".venv/bin/tower-train {' '.join(args)} --resume --skip-nonfinite"
    )
    listed = (directory / "checkpoint").read_text()
    assert 'model_checkpoint_path: "ckpt-4"' in listed and "ckpt-6" not in listed
    kept = state(directory / "ckpt-4")
    assert all(np.isfinite(v).all() for v in kept.values()
               if isinstance(v, np.ndarray) and v.dtype.kind == "f")


@pytest.mark.slow
@pytest.mark.parametrize("per_loop", ["1", "4"])
def test_skip_nonfinite_skips_and_counts(tmp_path, per_loop):
    metrics = tmp_path / "m.jsonl"
    result = run_cli("tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
                     "--epochs", "1", "--steps-per-epoch", "8", "--model",
                     "tests.user_models:nan_on_tower_1_at_step_6", "--skip-nonfinite",
                     "--metrics", str(metrics), "--steps-per-loop", per_loop)
    assert result.returncode == 0, result.stderr
    warnings = [l for l in result.stdout.splitlines() if "update skipped" in l]
    assert [w.split(":")[2].strip() for w in warnings] == ["step 6", "step 7", "step 8"]
    (record,) = [json.loads(l) for l in metrics.read_text().splitlines()]
    assert (record["steps"], record["skipped"]) == (5, 3)
    assert np.isfinite(record["loss"])
    (end,) = [l for l in result.stdout.splitlines() if l.startswith("8/8 ") and "ms/step" in l]
    assert " - skipped: 3" in end and "overflows" not in end, end


@pytest.mark.slow
def test_deterministic_runs_give_identical_losses_and_weights(mnist_dir, tmp_path):
    runs = []
    for name in ("a", "b"):
        metrics, directory = tmp_path / f"{name}.jsonl", tmp_path / name
        result = run_cli("tower-train", "--devices", "cpu:2", "--data", mnist_dir,
                         "--epochs", "6", "--steps-per-epoch", "5", "--eval-steps", "2",
                         "--deterministic", "--metrics", str(metrics),
                         "--checkpoint-dir", str(directory), "--keep-checkpoints", "6")
        assert result.returncode == 0, result.stderr
        records = [json.loads(l) for l in metrics.read_text().splitlines()]
        runs.append(([r["loss"] for r in records], [r["eval_loss"] for r in records], directory))
    (losses_a, eval_a, dir_a), (losses_b, eval_b, dir_b) = runs
    assert len(losses_a) == 6 and len(set(losses_a)) == 6  # the loss moves
    assert losses_a == losses_b and eval_a == eval_b  # exactly, not approximately
    for step in range(5, 31, 5):
        a, b = state(dir_a / f"ckpt-{step}"), state(dir_b / f"ckpt-{step}")
        assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resume"], "--resume needs --checkpoint-dir DIR"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir DIR"),
        (["--checkpoint-dir", "/tmp/x", "--keep-checkpoints", "0"],
         "--keep-checkpoints (0) must be at least 1"),
        (["--checkpoint-dir", "/tmp/x", "--checkpoint-every", "10", "--steps-per-loop", "4"],
         "--checkpoint-every 10 is not a multiple of --steps-per-loop 4; checkpoints are "
         "saved between loops"),
    ],
)
def test_bad_checkpoint_flags(args, message):
    result = run_cli("tower-train", "--devices", "cpu:1", "--data-format", "synthetic", *args)
    assert result.returncode == 2
    assert result.stderr.strip() == f"tower-train: error: {message}"


def read_scalars(logdir):
    """{tag: [(step, value)]} from the TensorBoard event files under `logdir`."""
    out = {}
    for name in os.listdir(logdir):
        if not name.startswith("events.out.tfevents"):
            continue
        for record in tf.data.TFRecordDataset(os.path.join(logdir, name)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor).item()
                out.setdefault(value.tag, []).append((event.step, number))
    return out


@pytest.mark.slow
def test_logdir_gets_scalars_and_the_profiled_steps(tmp_path):
    logdir = tmp_path / "tb"
    metrics = tmp_path / "m.jsonl"
    result = run_cli("tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
                     "--epochs", "2", "--steps-per-epoch", "6", "--logdir", str(logdir),
                     "--profile-steps", "3:4", "--metrics", str(metrics))
    assert result.returncode == 0, result.stderr
    scalars = read_scalars(logdir)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 13))
    assert [s for s, _ in scalars["train/step_seconds"]] == list(range(1, 13))
    assert all(0 <= a <= 1 for _, a in scalars["train/accuracy"])
    records = [json.loads(l) for l in metrics.read_text().splitlines()]
    assert [v for _, v in scalars["epoch/images_per_sec"]] == pytest.approx(
        [r["images_per_sec"] for r in records])
    assert [s for s, _ in scalars["epoch/loss"]] == [6, 12]
    traces = list((logdir / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


@pytest.mark.slow
def test_loops_of_steps_write_a_scalar_per_step_and_trace_the_asked_steps(tmp_path):
    """--steps-per-loop 4 with --profile-steps 10:11: loops end at 1, 4, 6
    (the epoch), 8, 12, and every step still has its own loss; steps 10 and
    11 sit in the loop 9-12, which is traced, although no loop ends at step
    9 or 10."""
    logdir = tmp_path / "tb"
    result = run_cli("tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
                     "--epochs", "2", "--steps-per-epoch", "6", "--logdir", str(logdir),
                     "--profile-steps", "10:11", "--steps-per-loop", "4")
    assert result.returncode == 0, result.stderr
    scalars = read_scalars(logdir)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 13))
    # Each step's own loss, not its loop's last one repeated.
    assert len({v for _, v in scalars["train/loss"][1:4]}) == 3
    traces = list((logdir / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def write_lmdb_with_a_bad_record(path, digits, bad_index):
    import lmdb

    from engine.data import records

    env = lmdb.open(str(path), map_size=1 << 26, subdir=True)
    with env.begin(write=True) as txn:
        for i in range(64):
            image = b"\x89PNG but truncated" if i == bad_index else records.encode_png(
                digits.train_images[i])
            txn.put(f"{i:08d}".encode(), records.tensor_protos(image, int(digits.train_labels[i])))
    env.close()


def assert_names_the_bad_sample(data_dir, batch_size, sample):
    """Trains on two towers and checks the one-line error names `sample`."""
    result = run_cli("tower-train", "--devices", "cpu:2", "--data", str(data_dir),
                     "--batch-size", str(batch_size), "--epochs", "1",
                     "--steps-per-epoch", "10")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    # Without stick_to_shard both towers read every shard in turn, and DALI
    # fills its shuffle buffer ahead, so either tower may meet the sample first.
    assert re.fullmatch(
        r"tower-train: error: tower ([01]) \(/cpu:\1\): cannot decode "
        + re.escape(f"{sample}; remove or replace what is not a valid image"), last), last


@pytest.mark.slow
def test_a_corrupt_lmdb_record_is_named_with_the_tower(tmp_path, digits):
    write_lmdb_with_a_bad_record(tmp_path / "train", digits, bad_index=41)
    assert_names_the_bad_sample(tmp_path, 8, f"{tmp_path}/train record 41 (key 00000041)")


@pytest.mark.slow
def test_an_unreadable_image_file_is_named(tmp_path, digits):
    from engine.data import records

    for name in ("a", "b"):
        folder = tmp_path / "train" / name
        folder.mkdir(parents=True)
        for i in range(16):
            (folder / f"{i:02d}.png").write_bytes(records.encode_png(digits.train_images[i]))
    (tmp_path / "train" / "b" / "03.png").write_bytes(b"not an image")
    assert_names_the_bad_sample(tmp_path, 4, f"{tmp_path}/train/b/03.png")


@pytest.mark.slow
def test_a_damaged_checkpoint_list_still_finds_the_checkpoints(tmp_path):
    directory = tmp_path / "ck"
    args = ["--devices", "cpu:2", "--data-format", "synthetic", "--steps-per-epoch", "4",
            "--checkpoint-dir", str(directory)]
    assert run_cli("tower-train", *args, "--epochs", "1").returncode == 0
    (directory / "checkpoint").write_text("garbage\x00")
    result = run_cli("tower-train", *args, "--epochs", "2", "--resume")
    assert result.returncode == 0, result.stderr
    assert (f"warning: {directory}/checkpoint, the list of checkpoints, is missing or "
            "damaged; trying the 1 checkpoint(s) on disk") in result.stdout
    assert f"resumed from {directory}/ckpt-4 at step 4" in result.stdout


def test_a_signal_in_the_last_step_of_an_epoch_keeps_its_evaluation(tmp_path):
    """The signal is honoured after the epoch's evaluation, metrics and checkpoint."""
    from engine.core.options import LoopOptions
    from engine.run.signals import GracefulStop
    from engine.run.watchers import SignalWatcher

    stop = GracefulStop()
    stop.requested = signal.SIGINT
    watcher = SignalWatcher(stop, LoopOptions(epochs=2, steps_per_epoch=5, eval_steps=1))
    watcher.after_step(5, {"block_end": True})  # the epoch's last step: not yet
    with pytest.raises(Exception, match="SIGINT after step 5"):
        watcher.after_epoch(1, 5, {})
    watcher.after_epoch(2, 10, {})  # the run is done: let it finish
