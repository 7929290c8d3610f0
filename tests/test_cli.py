"""tower-train and tower-data from the command line: errors and real runs."""

import json

import pytest
from conftest import GPUS, HOST_DEVICES, run_cli, without_gpu

# A GPU this host does not have, and the hint tower-train adds on hosts without GPUs.
MISSING_GPU = GPUS
NO_GPU_HINT = "" if GPUS else " (no GPU here: use --devices cpu:N for N CPU towers)"


def one_line_error(result, prog="tower-train"):
    """The single stderr line of a refused command, after checking its shape."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: ")
    assert "Traceback" not in result.stderr
    return lines[0][len(f"{prog}: error: "):]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--devices", ""], "--devices is empty; give GPU indices (0,1), 'all', 'cpu:N' or "
            "device names (/gpu:0,/cpu:0)"),
        (["--devices", "1,1"], "--devices '1,1': /gpu:1 is listed twice; each device carries one "
            "tower"),
        (["--devices", "cpu:0"], "--devices 'cpu:0': N must be at least 1 for cpu:N, got 0"),
        (["--devices", "gpu0"], "--devices 'gpu0': 'gpu0' is not a GPU index or a device name; "
            "use GPU indices (0,1), 'all', 'cpu:N' or names like /gpu:0 or w1/gpu:0 (task 1 of "
            "the cluster's workers)"),
        (["--devices", "cpu:2", "--reduce-device", "cpu2"], "--reduce-device 'cpu2' is not a "
            "device name; use a name like /cpu:0, /gpu:1 or w1/gpu:0"),
        (["--data", "/nonexistent/mnist"], "--data '/nonexistent/mnist' is not a directory; it "
            "should hold train/ (and val/), as written by 'tower-data mnist DIR'"),
        (["--batch-size", "0", "--data-format", "synthetic"], "--batch-size (0) must be at least "
            "1"),
        (["--batch-size", "many"], "Invalid value for '--batch-size': 'many' is not a valid "
            "integer."),
        (["--data-format", "csv"], "Invalid value for '--data-format': 'csv' is not one of "
            "'auto', 'caffe2', 'folder', 'jpeg', 'tfrecord', 'text', 'synthetic'."),
        (["--image-size", "0", "--data-format", "synthetic"], "--image-size (0) must be at least "
            "1"),
        (["--data-format", "folder"], "--data-format folder reads class folders from --data DIR; "
            "MNIST comes as caffe2, jpeg or tfrecord"),
        (["--data-format", "synthetic", "--num-classes", "0"], "--num-classes (0) must be at "
            "least 1"),
        (["--data-format", "synthetic", "--synthetic-samples", "0"], "--synthetic-samples (0) "
            "must be at least 1"),
        (["--synthetic-samples", "8"], "--synthetic-samples (8) is for --data-format synthetic"),
        (["--num-classes", "5"], "--num-classes is for --data-format synthetic or a --data "
            "directory of TFRecords; MNIST has 10"),
        (["--optimizer", "lamb"], "Invalid value for '--optimizer': 'lamb' is not one of 'sgd', "
            "'momentum', 'adam', 'rmsprop'."),
        (["--metrics", "/nonexistent/m.jsonl"], "--metrics '/nonexistent/m.jsonl': its directory "
            "does not exist"),
        (["--xla", "--deterministic"], "--xla --deterministic: XLA has no deterministic version "
            "of some ops (max-pooling gradients, for one) and TensorFlow refuses them mid-run; "
            "drop one of the two flags"),
    ],
)
def test_bad_input_before_tensorflow(args, message):
    assert one_line_error(run_cli("tower-train", *args)) == message


@pytest.mark.parametrize(
    "args, message",
    [
        (["--devices", f"{MISSING_GPU},{MISSING_GPU + 1}"], f"--devices: GPU {MISSING_GPU} does "
            f"not exist; devices here: {HOST_DEVICES}{NO_GPU_HINT}"),
        (["--devices", f"/gpu:{MISSING_GPU}"], f"--devices: GPU {MISSING_GPU} does not exist; "
            f"devices here: {HOST_DEVICES}{NO_GPU_HINT}"),
        (["--devices", "/cpu:0,/cpu:1"], f"--devices: /cpu:1 does not exist; devices here: "
            f"{HOST_DEVICES}{NO_GPU_HINT}"),
        (["--devices", "cpu:2", "--reduce-device", "/cpu:2"], f"--reduce-device /cpu:2 does not "
            f"exist; devices here: {HOST_DEVICES.replace('/cpu:0', '/cpu:0, /cpu:1')}"),
        (["--devices", "cpu:2", "--reduce-device", f"/gpu:{MISSING_GPU}"],
         f"--reduce-device /gpu:{MISSING_GPU} does not exist; devices here: "
         f"{HOST_DEVICES.replace('/cpu:0', '/cpu:0, /cpu:1')}"),
        (["--devices", "cpu:1", "--data-format", "synthetic", "--model", "towers.nothing:here"],
            "--model "
            "'towers.nothing:here': cannot import 'towers.nothing' (No module named "
            "'towers.nothing')"),
        (["--devices", "cpu:1", "--data-format", "synthetic", "--model", "resnet"], "--model "
            "'resnet' is not one of mlp, lenet, resnet20, resnet50, transformer and not "
            "package.module:function"),
        (["--devices", "cpu:1", "--data-format", "synthetic", "--epochs", "0"], "--epochs (0) "
            "must be a positive integer"),
        (["--devices", "cpu:2", "--data-format", "synthetic", "--xla"], "--xla --variables "
            "reduce-device: an XLA cluster reads the variables on its tower's device, and "
            "TensorFlow cannot read variables on the reduce device from a tower on another; add "
            "--variables replicated"),
        (["--devices", "cpu:1", "--data-format", "synthetic", "--model", "transformer"], "--model "
            "transformer reads byte sequences; add --data-format text"),
    ],
)
def test_bad_input_that_needs_tensorflow_to_see(args, message):
    assert one_line_error(run_cli("tower-train", *args)) == message


def test_data_smaller_than_a_batch_per_shard_is_refused(mnist_dir):
    result = run_cli("tower-train", "--devices", "cpu:4", "--data", mnist_dir,
                     "--batch-size", "20000")
    assert one_line_error(result) == (
        f"--batch-size 20000: {mnist_dir}/train has 60000 samples, 15000 per shard "
        "for 4 towers, fewer than one batch; lower --batch-size or use fewer towers"
    )


def test_bad_input_keeps_metrics_already_written(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"epoch": 1}\n')
    result = run_cli("tower-train", "--devices", str(MISSING_GPU), "--metrics", str(metrics))
    assert result.returncode == 2
    assert metrics.read_text() == '{"epoch": 1}\n'


@without_gpu
def test_gpu_split_on_a_host_without_gpus_is_refused():
    result = run_cli("tower-train", "--devices", "gpu:2", "--data-format", "synthetic")
    assert one_line_error(result) == (
        "--devices gpu:2 splits GPU 0 into logical GPUs, but this machine has no GPU; "
        "use --devices cpu:N for N CPU towers"
    )


def test_gpu_memory_without_a_gpu_split_is_refused_before_tensorflow():
    result = run_cli("tower-train", "--devices", "cpu:2", "--gpu-memory", "2048")
    assert one_line_error(result) == (
        "--gpu-memory 2048 sets the memory of each logical GPU of --devices gpu:N; "
        "add --devices gpu:N or drop --gpu-memory"
    )


def test_tower_data_names_a_bad_source(tmp_path):
    result = run_cli("tower-data", "mnist", str(tmp_path / "out"), "--from", "/nope.npz")
    assert one_line_error(result, "tower-data") == (
        "--from '/nope.npz' is neither a directory of IDX files nor an existing .npz file"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_mnist_on_two_cpu_towers_reaches_the_target_accuracy(mnist_dir, tmp_path):
    """The issue's acceptance run: 5 x 100 steps of 2 x 64 real digits."""
    metrics = tmp_path / "metrics.jsonl"
    result = run_cli(
        "tower-train", "--devices", "cpu:2", "--data", mnist_dir, "--model", "mlp",
        "--batch-size", "64", "--epochs", "5", "--steps-per-epoch", "100",
        "--metrics", str(metrics),
    )
    assert result.returncode == 0, result.stderr
    assert "  tower 1  /cpu:1   shard 1/2 of caffe2" in result.stdout
    assert "  reduce   /cpu:0   variables, mean of 2 gradients, adam update" in result.stdout
    assert result.stdout.count("100/100 ━") == 5
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["steps"] == 100 and r["eval_samples"] == 10000 for r in records)
    last = records[-1]
    assert last["accuracy"] >= 0.93
    assert last["eval_accuracy"] >= 0.94
    assert records[0]["loss"] > last["loss"]
    assert last["images_per_sec"] > 0 and last["seconds"] > 0


@pytest.mark.slow
def test_lenet_trains_on_four_towers_with_a_user_reduce_device(mnist_dir, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = run_cli(
        "tower-train", "--devices", "cpu:4", "--reduce-device", "/cpu:3",
        "--data", mnist_dir, "--model", "lenet", "--batch-size", "32",
        "--epochs", "2", "--steps-per-epoch", "60", "--eval-steps", "10",
        "--metrics", str(metrics),
    )
    assert result.returncode == 0, result.stderr
    assert "tower-train: 4 towers, batch 32 per tower (128 per step), model lenet" in result.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["eval_samples"] for r in records] == [4 * 10 * 32] * 2
    assert records[-1]["eval_accuracy"] >= 0.85


@pytest.mark.slow
def test_user_model_function_is_loaded(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = run_cli(
        "tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
        "--model", "tests.user_models:tiny", "--epochs", "1", "--steps-per-epoch", "5",
        "--metrics", str(metrics),
    )
    assert result.returncode == 0, result.stderr
    assert "model tiny (7,850 parameters)" in result.stdout
    (record,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert record["steps"] == 5 and record["eval_loss"] is None


def test_held_out_set_smaller_than_the_tower_count_is_refused(tmp_path, digits):
    from engine.data import records

    records.write_lmdb(str(tmp_path / "train"), digits.train_images[:64], digits.train_labels[:64])
    records.write_lmdb(str(tmp_path / "val"), digits.test_images[:3], digits.test_labels[:3])
    result = run_cli("tower-train", "--devices", "cpu:4", "--data", str(tmp_path),
                     "--batch-size", "8")
    assert one_line_error(result) == (
        f"--data: {tmp_path}/val has 3 held-out samples, fewer than the 4 towers that "
        "each need a shard of it; add samples or remove val/"
    )
