"""The Python API: the docs' Python API example, the CLI as a thin layer over it, a
user's own DALI pipeline, and one-line errors for the user's own code."""

import json
import os
import re
import subprocess
import sys

import keras
import pytest
from conftest import REPO, run_cli

import engine.errors
import towers
from engine.userfn import UserCodeError
from towers.cli.train import FLAGS

EXAMPLE = os.path.join(REPO, "docs", "examples", "python_api.py")


@pytest.mark.slow
def test_the_python_api_example_trains_real_mnist_to_95_percent(mnist_dir, tmp_path):
    # towers.data.mnist() reads $XDG_CACHE_HOME/tower-train/mnist: point it here.
    (tmp_path / "tower-train").mkdir()
    (tmp_path / "tower-train" / "mnist").symlink_to(mnist_dir)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    accuracy = float(re.search(r"eval accuracy ([0-9.]+) on 10000 digits", result.stdout)[1])
    assert accuracy >= 0.95


API_RUN = """
import sys, towers
trainer = towers.Trainer("cpu:2", model="lenet", reducer="ring", batch_size=32, seed=3,
                         deterministic=True, data=towers.data.directory(sys.argv[1]))
trainer.fit(epochs=2, steps_per_epoch=15, eval_steps=4, metrics=sys.argv[2])
"""


@pytest.mark.slow
def test_the_cli_and_the_api_give_identical_losses(mnist_dir, tmp_path):
    cli_metrics, api_metrics = tmp_path / "cli.jsonl", tmp_path / "api.jsonl"
    cli = run_cli("tower-train", "--devices", "cpu:2", "--model", "lenet", "--reducer", "ring",
                  "--batch-size", "32", "--seed", "3", "--deterministic", "--data", mnist_dir,
                  "--epochs", "2", "--steps-per-epoch", "15", "--eval-steps", "4",
                  "--metrics", str(cli_metrics))
    assert cli.returncode == 0, cli.stderr
    api = subprocess.run([sys.executable, "-c", API_RUN, mnist_dir, str(api_metrics)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert api.returncode == 0, api.stderr[-2000:]
    keys = ("loss", "accuracy", "eval_loss", "eval_accuracy")
    records = [[json.loads(line) for line in open(p)] for p in (cli_metrics, api_metrics)]
    assert [[r[k] for k in keys] for r in records[0]] == [
        [r[k] for k in keys] for r in records[1]
    ]
    assert len(records[0]) == 2 and records[0][1]["loss"] < records[0][0]["loss"]


def test_a_user_pipeline_trains_through_the_api(mnist_dir, monkeypatch):
    from tests.user_pipelines import mnist_digits

    monkeypatch.setenv("TOWER_TEST_MNIST", mnist_dir)
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], model="mlp", batch_size=64,
                             data=towers.data.pipeline(mnist_digits, val_size=10000))
    with open(os.devnull, "w") as quiet:
        trainer.stream = quiet
        (record,) = trainer.fit(epochs=1, steps_per_epoch=150)
    assert record["eval_samples"] == 10000
    assert record["eval_accuracy"] > 0.85


@pytest.mark.slow
def test_a_user_pipeline_trains_through_the_cli(mnist_dir, monkeypatch):
    monkeypatch.setenv("TOWER_TEST_MNIST", mnist_dir)
    result = run_cli("tower-train", "--devices", "cpu:2", "--data-pipeline",
                     "tests.user_pipelines:mnist_digits", "--epochs", "1",
                     "--steps-per-epoch", "60")
    assert result.returncode == 0, result.stderr
    assert "shard 1/2 of pipeline tests.user_pipelines:mnist_digits, on CPU" in result.stdout
    loss = float(re.findall(r"loss: ([0-9.]+)", result.stdout)[-1])
    assert loss < 1.0  # the digits are learnt: chance is 2.30


@pytest.mark.parametrize("make, message", [
    (lambda: towers.Trainer(["/cpu:0"], reducer="tests.user_reducers:two_arguments",
                            data=towers.data.synthetic()),
     "reducer 'tests.user_reducers:two_arguments' takes (tower_grads, devices); a reducer "
     "takes (tower_grads, devices, destinations) and returns the mean for each destination"),
    (lambda: towers.Trainer(["/cpu:0"], model="tests.user_models:needs_width",
                            data=towers.data.synthetic()),
     "model 'tests.user_models:needs_width' takes (width, input_shape, num_classes); a model "
     "function takes input_shape and num_classes (each optional, by those names) and returns "
     "a keras.Model"),
    (lambda: towers.data.pipeline("tests.user_pipelines:takes_nothing"),
     "pipeline 'tests.user_pipelines:takes_nothing' takes no arguments; a pipeline function "
         "takes one "
     "Shard (towers.data.Shard) and returns a DALI pipeline of (images, labels)"),
])
def test_user_functions_with_the_wrong_signature_get_one_line(make, message):
    with pytest.raises(towers.UsageError) as err:
        make()
    assert str(err.value) == message


def test_a_user_reducer_that_raises_is_named_in_one_line():
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], reducer="tests.user_reducers:raises",
                             data=towers.data.synthetic())
    with pytest.raises(UserCodeError) as err, open(os.devnull, "w") as quiet:
        trainer.stream = quiet
        trainer.fit(epochs=1, steps_per_epoch=2)
    assert str(err.value) == (
        "reducer 'tests.user_reducers:raises' raised ValueError: no reduction for you"
    )
    assert isinstance(err.value.original, ValueError)  # the user's frames, for --debug


@pytest.mark.slow
def test_a_user_reducer_that_raises_from_the_cli(tmp_path):
    result = run_cli("tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
                     "--reducer", "tests.user_reducers:raises", "--epochs", "1",
                     "--steps-per-epoch", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "tower-train: error: --reducer 'tests.user_reducers:raises' raised ValueError: no "
        "reduction for you (--debug prints its traceback)"
    )
    debug = run_cli("tower-train", "--devices", "cpu:2", "--data-format", "synthetic",
                    "--reducer", "tests.user_reducers:raises", "--epochs", "1",
                    "--steps-per-epoch", "2", "--debug")
    assert debug.returncode == 2
    assert 'tests/user_reducers.py", line' in debug.stderr  # the user's own frame


def test_check_reducer_catches_a_sum_with_its_factor():
    result = run_cli("tower-train", "--devices", "cpu:4", "--data-format", "synthetic",
                     "--reducer", "tests.user_reducers:summed", "--check-reducer",
                     "--epochs", "1", "--steps-per-epoch", "2")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tower-train: error: --check-reducer: --reducer 'tests.user_reducers:summed' "
        "returned 4.00 x the mean (the sum over 4 towers?); divide by len(devices)"
    )


def test_errors_name_python_arguments_and_the_cli_names_flags():
    with pytest.raises(towers.UsageError) as err:
        towers.Trainer(["/cpu:0"], learning_rate=0, data=towers.data.synthetic())
    assert str(err.value) == "learning_rate (0) must be positive"
    assert err.value.render(FLAGS) == "--lr (0) must be positive"
    with pytest.raises(towers.UsageError) as err:
        towers.Trainer(["/cpu:0", "/cpu:1"], xla=True, data=towers.data.synthetic())
    assert str(err.value).startswith("xla=True variables='reduce-device': an XLA cluster")
    assert str(err.value).endswith("add variables='replicated'")
    assert err.value.render(FLAGS).startswith("--xla --variables reduce-device: an XLA")


def test_every_engine_error_is_a_tower_error():
    from engine.data import DataError, GpuUnavailableError
    from engine.placement.log import StrayPlacementError
    from engine.reducers import ReducerError
    from engine.run.checkpoint import CheckpointError
    from engine.run.guard import NonFiniteError
    from engine.topology.cluster import ClusterError, ClusterUnavailable
    from engine.topology.devices import DeviceError
    from towers.models import ModelError

    bad_input = [DataError, GpuUnavailableError, ReducerError, ClusterError, DeviceError,
                 ModelError, UserCodeError]
    failed_runs = [StrayPlacementError, CheckpointError, NonFiniteError, ClusterUnavailable]
    assert all(issubclass(e, engine.errors.UsageError) for e in bad_input)
    assert all(issubclass(e, engine.errors.RunError) for e in failed_runs)


def test_logits_and_a_keras_loss_train_in_process():
    def logits(input_shape, num_classes):
        return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                                 keras.layers.Dense(num_classes)], name="logits")

    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], model=logits, data=towers.data.synthetic(),
                             loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with open(os.devnull, "w") as quiet:
        trainer.stream = quiet
        (record,) = trainer.fit(epochs=1, steps_per_epoch=3)
    # Uniform noise and random labels: the loss is about log(10) = 2.30.
    assert 2.0 < record["loss"] < 2.8


def test_the_python_api_example_reducer_passes_the_conformance_check():
    """The example's own reducer, taken from the script without running its
    training: the checks tower-reduce-bench --check runs."""
    import ast

    from engine.reducers import conformance

    with open(EXAMPLE) as stream:
        tree = ast.parse(stream.read())
    kept = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom | ast.FunctionDef)]
    namespace = {}
    exec(compile(ast.Module(kept, []), EXAMPLE, "exec"), namespace)
    rows = conformance.check(namespace["mean_on_first_tower"], [f"/cpu:{k}" for k in range(4)])
    conformance.assert_all_passed(rows)
    assert {r.towers for r in rows if r.name == "mean"} == {1, 2, 3, 4}
