"""A newcomer's first hour: nothing lost or misreported, impossible pairings
refused in one line, quiet by default, Keras' and click's conventions."""

import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
from conftest import BIN, GPUS, REPO, run_cli

import towers

pytestmark = pytest.mark.xdist_group("first_hour")

TRAIN = ("tower-train", "--devices", "cpu:2", "--epochs", "1", "--steps-per-epoch", "3",
         "--eval-steps", "1")


def error_line(result) -> str:
    """The one line a refused command printed; it must be the only one."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0].removeprefix("tower-train: error: ")


def digests(folder) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(folder))}


@pytest.mark.slow
@pytest.mark.parametrize("changed, message", [
    (["--devices", "cpu:1"],
     "was written with towers /cpu:0,/cpu:1, and this run has towers /cpu:0; resume with "
     "the same --devices, or start afresh with another --checkpoint-dir (the checkpoints "
     "are left as they are)"),
    (["--model", "lenet", "--batch-size", "32"],
     "was written with batch 64, model mlp, and this run has batch 32, model lenet; resume "
     "with the same --batch-size and --model, or start afresh with another "
     "--checkpoint-dir (the checkpoints are left as they are)"),
])
def test_resuming_with_other_settings_is_refused_and_the_checkpoints_stay(
        mnist_dir, tmp_path, changed, message):
    folder = tmp_path / "ck"
    first = run_cli(*TRAIN, "--data", mnist_dir, "--checkpoint-dir", str(folder))
    assert first.returncode == 0, first.stderr
    before = digests(folder)
    args = list(TRAIN) + ["--data", mnist_dir, "--checkpoint-dir", str(folder), "--resume"]
    for flag_and_value in zip(changed[::2], changed[1::2]):
        if flag_and_value[0] in args:
            at = args.index(flag_and_value[0])
            args[at + 1] = flag_and_value[1]
        else:
            args += flag_and_value
    refused = run_cli(*args)
    assert refused.returncode == 2
    assert error_line(refused) == f"--resume: {folder}/ckpt-3 {message}"
    assert "cannot be restored" not in refused.stdout + refused.stderr
    assert digests(folder) == before


def test_an_uncreatable_checkpoint_folder_is_refused_before_anything_is_built(
        tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    trainer = towers.Trainer("/cpu:0", data=towers.data.synthetic(), stream=io.StringIO())
    with pytest.raises(towers.UsageError) as err:
        trainer.fit(epochs=1, steps_per_epoch=2, checkpoint_dir=str(blocker / "ck"))
    assert str(err.value) == (
        f"checkpoint_dir '{blocker}/ck' cannot be created: {blocker} is a file, not a "
        "directory; give a directory path"
    )
    assert trainer.built is None  # refused before the first step, nothing built


def test_a_disk_without_room_for_a_checkpoint_is_refused():
    from engine.run import outputs

    outputs.check_room("checkpoint_dir", "/x", 1_000_000, free_bytes=2_000_000)
    with pytest.raises(towers.UsageError) as err:
        outputs.check_room("checkpoint_dir", "/x", 300_000_000, free_bytes=120_000_000)
    assert str(err.value) == (
        "checkpoint_dir '/x': a checkpoint needs about 300.0 MB and its disk has 120.0 MB "
        "free; free some room or give a directory on another disk"
    )


@pytest.mark.parametrize("args, message", [
    (["--data-format", "text"],
     "--model mlp reads images; text feeds a sequence model such as --model transformer"),
    (["--data-format", "text", "--model", "resnet20"],
     "--model resnet20 reads images; text feeds a sequence model such as --model "
     "transformer"),
    (["--model", "transformer"], "--model transformer reads byte sequences; add "
     "--data-format text"),
    (["--model", "transformer:layers=1", "--data-format", "synthetic"],
     "--model transformer:layers=1 reads byte sequences; add --data-format text"),
])
def test_a_zoo_model_on_data_it_cannot_read_is_refused_before_tensorflow(args, message):
    result = run_cli("tower-train", "--devices", "cpu:1", *args)
    assert result.returncode == 2
    assert error_line(result) == message
    assert "starting TensorFlow" not in result.stdout


@pytest.mark.parametrize("model, extra, message", [
    ("tests.user_models:logits", [],
     "--model tests.user_models:logits gives outputs that are not probabilities (a row "
     "sums to {sum}, the smallest is {min}), and the default loss takes softmax outputs; "
     "if they are logits, add --from-logits"),
    ("tests.user_models:three_classes", [],
     "--model tests.user_models:three_classes gives outputs of shape (2, 3) for 2 28x28x1 "
     "images; the labels need (2, 10): one output per class"),
    ("resnet50", ["--data-format", "synthetic", "--image-size", "8"],
     "--model 'resnet50' raised ValueError: Input size must be at least 32x32; Received: "
     "input_shape=(8, 8, 3) (--debug prints its traceback)"),
])
def test_a_model_that_does_not_fit_the_data_or_the_loss_is_refused_in_one_line(
        mnist_dir, model, extra, message):
    data = [] if extra else ["--data", mnist_dir]
    result = run_cli(*TRAIN, "--model", model, *data, *extra)
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    if "{sum}" in message:  # the figures are the model's own: check the words around them
        head, tail = message.split("(a row sums to {sum}, the smallest is {min})")
        assert line.startswith(head) and line.endswith(tail), line
    else:
        assert line == message
    assert "Epoch 1/1" not in result.stdout


@pytest.mark.slow
def test_from_logits_trains_a_model_without_softmax(mnist_dir, tmp_path):
    metrics = tmp_path / "m.jsonl"
    result = run_cli("tower-train", "--devices", "cpu:2", "--epochs", "1", "--data", mnist_dir,
                     "--model", "tests.user_models:logits", "--from-logits",
                     "--steps-per-epoch", "40", "--eval-steps", "5",
                     "--metrics", str(metrics))
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert record["eval_accuracy"] > 0.6  # chance is 0.1


def test_help_and_version_follow_click():
    short = run_cli("tower-train", "-h")
    assert short.returncode == 0 and short.stdout == run_cli("tower-train", "--help").stdout
    sections = [line for line in short.stdout.splitlines()
                if line.endswith(":") and not line.startswith(" ")]
    assert sections[:4] == ["Devices:", "Data:", "Model and loss:", "Training:"]
    assert "Precision and speed:" in sections and "Checkpoints:" in sections
    version = run_cli("tower-train", "--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"tower-train {towers.__version__}"
    assert towers.__version__ == "0.1.0"


# The exit codes the docs document (Troubleshooting): 0 done, 1 a run that could not go on,
# 2 bad input (before anything is written).
@pytest.mark.slow
@pytest.mark.parametrize("args, code", [
    (["--epochs", "1", "--steps-per-epoch", "2", "--eval-steps", "1"], 0),
    (["--epochs", "0"], 2),
    (["--lr", "0"], 2),
    (["--reducer", "nosuch"], 2),
    (["--devices", "cpu:0"], 2),
    (["--nosuch-flag"], 2),
    (["--model", "tests.user_models:nan_on_tower_1_at_step_6", "--epochs", "1",
      "--steps-per-epoch", "8", "--eval-steps", "1"], 1),
])
def test_exit_codes_are_as_documented(mnist_dir, args, code):
    devices = [] if "--devices" in args else ["--devices", "cpu:2"]
    result = run_cli("tower-train", *devices, "--data", mnist_dir, *args)
    assert result.returncode == code, result.stderr


def test_bad_values_are_refused_before_tensorflow_starts():
    for args in (["--epochs", "0"], ["--lr", "0"], ["--reducer", "nosuch"],
                 ["--steps-per-loop", "0"], ["--keep-checkpoints", "0"]):
        result = run_cli("tower-train", "--devices", "cpu:1", *args)
        assert result.returncode == 2, args
        assert "starting TensorFlow" not in result.stdout, args
        assert error_line(result)


@pytest.mark.slow
def test_import_towers_prints_no_cpp_logs():
    """On a machine without a GPU TensorFlow would print its start-up banner
    and a cuInit error; after `import towers`, nothing, whoever imports it."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    code = ("import towers, keras, tensorflow as tf; "
            "print(len(tf.config.list_logical_devices()))")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, cwd=REPO, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # The user's own level wins: TensorFlow says what it says.
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"}, cwd=REPO, timeout=300)
    assert loud.returncode == 0 and loud.stderr != ""


@pytest.mark.slow
def test_starting_tensorflow_is_said_before_the_wait():
    result = run_cli("tower-train", "--devices", "cpu:1", "--data-format", "synthetic",
                     "--epochs", "1", "--steps-per-epoch", "1", "--eval-steps", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "tower-train: starting TensorFlow ..."
    assert result.stderr == ""


class Record(towers.callbacks.Callback):
    def __init__(self):
        self.seen = []

    def on_epoch_end(self, epoch, logs):
        self.seen.append((epoch, logs["epoch"], logs["val_loss"] == logs["eval_loss"]))


def test_verbose_callbacks_and_early_stopping(mnist_dir):
    stream = io.StringIO()
    trainer = towers.Trainer("/cpu:0", data=towers.data.directory(mnist_dir), stream=stream,
                             learning_rate=1e-9)
    record = Record()
    # A learning rate that learns nothing: eval_loss stops improving, and
    # early stopping ends the run after patience + 1 epochs without a gain.
    stopper = towers.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.01)
    history = trainer.fit(epochs=6, steps_per_epoch=2, verbose=0,
                          callbacks=[record, stopper])
    assert stream.getvalue() == ""
    assert [r["epoch"] for r in history] == [1, 2, 3]
    assert record.seen == [(0, 1, True), (1, 2, True), (2, 3, True)]
    assert stopper.stopped_epoch == 2
    stream.truncate(0)
    stream.seek(0)
    trainer.fit(epochs=4, steps_per_epoch=2, eval_steps=0, verbose=2)
    lines = stream.getvalue().splitlines()
    assert [line for line in lines if line.startswith("Epoch ")] == ["Epoch 4/4"]
    assert sum(line.startswith("2/2 - ") for line in lines) == 1
    assert "━" not in stream.getvalue()


@pytest.mark.slow
def test_a_saved_model_loads_without_this_package(mnist_dir, tmp_path):
    trainer = towers.Trainer("/cpu:0", data=towers.data.directory(mnist_dir),
                             stream=io.StringIO())
    trainer.fit(epochs=1, steps_per_epoch=20, eval_steps=0)
    path = trainer.save(str(tmp_path / "mlp.keras"))
    import numpy as np

    images = np.full((3, 28, 28, 1), 0.5, np.float32)
    want = trainer.model(images, training=False).numpy()
    code = ("import sys, numpy as np, keras; "
            "assert not any(m.split('.')[0] in ('towers', 'engine') for m in sys.modules); "
            f"m = keras.models.load_model({path!r}); "
            "print(m(np.full((3, 28, 28, 1), 0.5, np.float32)).numpy().tolist())")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=str(tmp_path), timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    np.testing.assert_allclose(json.loads(loaded.stdout), want, rtol=1e-6)


@pytest.mark.slow
def test_the_python_api_example_prints_only_its_own_lines():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([os.path.join(BIN, "python"), "docs/examples/python_api.py"],
                            capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines()[-1].startswith("eval accuracy 0.9")


def test_a_python_user_is_warned_in_python_terms(mnist_dir):
    """The engine speaks Python: a skipped step's warning names the argument
    as a Python user writes it; tower-train says the same with its flag."""
    stream = io.StringIO()
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"],
                             model="tests.user_models:nan_on_tower_1_at_step_6",
                             data=towers.data.directory(mnist_dir), stream=stream)
    trainer.fit(epochs=1, steps_per_epoch=6, eval_steps=0, skip_nonfinite=True)
    warnings = [line for line in stream.getvalue().splitlines() if "warning" in line]
    assert warnings == [
        "warning: step 6: the loss or a gradient of tower 1 (/cpu:1) is not finite; update "
        "skipped (skip_nonfinite=True)"
    ]
    assert not any(line.startswith("tower-train") for line in stream.getvalue().splitlines())


@pytest.mark.slow
def test_list_devices_names_the_devices_and_why_a_gpu_is_missing(tmp_path):
    """--list-devices prints what --devices can name; where the driver lists
    a GPU that TensorFlow does not see, it says why and what to do. (A
    driver that lists one is played by a script named nvidia-smi.)"""
    result = run_cli("tower-train", "--list-devices")
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "tower-train: starting TensorFlow ..."
    assert lines[1] == f"  /cpu:0   CPU, {os.cpu_count()} cores (cpu:N splits it into N towers)"
    if GPUS:
        assert lines[2].startswith("  /gpu:0   ")
        return
    assert lines[2] == ("tower-train: no GPU: no NVIDIA driver answers here (nvidia-smi); "
                        "CPU towers only")
    driver = tmp_path / "nvidia-smi"
    driver.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    driver.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    listed = subprocess.run([os.path.join(BIN, "tower-train"), "--list-devices"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[2] == (
        "tower-train: no GPU for TensorFlow: the driver lists 1 (GPU 0: NVIDIA H200), but "
        "this environment has no CUDA libraries for TensorFlow (it was set up where "
        "nvidia-smi did not answer); remove .venv and run ./scripts/setup again on this "
        "machine")
