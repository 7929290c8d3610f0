"""Learning-rate schedules: the rate at chosen updates for each shape after a
warm-up, the rate each step's update used as the callbacks, TensorBoard and
the metrics file see it, a resume in the middle of the warm-up that goes on
along the same curve, a Keras schedule of the user's, and one-line refusals."""

import io
import json
import math

import keras
import numpy as np
import pytest
from conftest import flag_message, run_cli
from test_faults import read_scalars

import towers
from engine.core import schedules
from engine.errors import UsageError


def rates(spec, updates, *, warmup_epochs=1, rate=0.4, steps_per_epoch=4, total=16):
    """The rate of each update number in `updates`, for a run of `total` steps."""
    made = schedules.LearningRates(rate, schedules.parse(spec, warmup_epochs))
    made.new()
    made.set_lengths(steps_per_epoch, total)
    return [round(made.at(k), 6) for k in updates]


@pytest.mark.parametrize("spec, want", [
    # A warm-up of one epoch (4 updates): 0.1, 0.2, 0.3, then 0.4 from update 3 on.
    ("constant", [0.1, 0.2, 0.3, 0.4, 0.4, 0.4]),
    # Times 0.1 every 2 epochs (8 updates), counted from the run's start.
    ("step:2:0.1", [0.1, 0.2, 0.3, 0.4, 0.4, 0.04]),
    # Over the 12 updates after the warm-up: half way (update 9) 0.2, at the end 0.
    ("cosine", [0.1, 0.2, 0.3, 0.4, 0.2, 0.0]),
    ("poly", [0.1, 0.2, 0.3, 0.4, 0.1, 0.0]),
    ("poly:1", [0.1, 0.2, 0.3, 0.4, 0.2, 0.0]),
])
def test_each_shape_after_a_warm_up_at_chosen_updates(spec, want):
    got = rates(spec, [0, 1, 2, 3, 9 if spec != "step:2:0.1" else 7, 15 if spec != "step:2:0.1"
                       else 8])
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_cosine_without_warm_up_follows_the_formula():
    got = rates("cosine", range(16), warmup_epochs=0)
    want = [0.4 * 0.5 * (1 + math.cos(math.pi * (k + 1) / 16)) for k in range(16)]
    np.testing.assert_allclose(got, want, atol=1e-6)


class Rates(towers.callbacks.Callback):
    def __init__(self, crash_after=None):
        self.seen, self.crash_after = {}, crash_after

    def on_train_batch_end(self, batch, logs):
        self.seen[logs["step"]] = round(logs["learning_rate"], 6)
        if logs["step"] == self.crash_after:
            raise KeyboardInterrupt


def fit(tmp_path, name, *, crash_after=None, resume=False, **trainer):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], optimizer="sgd", learning_rate=0.4,
                             batch_size=32, stream=io.StringIO(), **trainer)
    seen = Rates(crash_after)
    try:
        trainer.fit(epochs=3, steps_per_epoch=4, eval_steps=1, callbacks=[seen],
                    checkpoint_dir=str(folder / "ck"), checkpoint_every=2, resume=resume,
                    logdir=str(folder / "tb"), metrics=str(folder / "m.jsonl"), verbose=2)
    except KeyboardInterrupt:
        pass
    return seen.seen, folder, trainer


@pytest.mark.slow
def test_every_step_reports_its_rate_and_a_resume_mid_warm_up_goes_on_along_the_curve(
        tmp_path):
    """Warm-up over 2 epochs (8 steps), then cosine to 0 at step 12. A run
    saved at step 2 and crashed there, resumed, sees the rates of the run
    that never stopped, in callbacks, TensorBoard and the metrics file."""
    schedule = dict(lr_schedule="cosine", warmup_epochs=2)
    whole, folder, trainer = fit(tmp_path, "whole", **schedule)
    want = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.4 * 0.5 * (1 + math.cos(math.pi / 4)),
            0.2, 0.4 * 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    np.testing.assert_allclose([whole[s] for s in range(1, 13)], want, atol=1e-6)
    board = read_scalars(folder / "tb")["train/learning_rate"]
    assert [s for s, _ in board] == list(range(1, 13))
    np.testing.assert_allclose([v for _, v in board], want, atol=1e-6)
    records = [json.loads(line) for line in open(folder / "m.jsonl")]
    np.testing.assert_allclose([r["learning_rate"] for r in records], [want[3], want[7], 0.0],
                               atol=1e-6)
    assert "linear warm-up over 2 epochs, then cosine decay to 0" in trainer.stream.getvalue()

    crashed, _, _ = fit(tmp_path, "resumed", crash_after=2, **schedule)
    assert crashed == {1: 0.05, 2: 0.1}
    resumed, _, _ = fit(tmp_path, "resumed", resume=True, **schedule)
    assert sorted(resumed) == list(range(3, 13))
    assert resumed == {s: v for s, v in whole.items() if s > 2}


@pytest.mark.slow
def test_a_keras_schedule_or_a_function_of_the_update_is_used_as_it_is(tmp_path):
    decay = keras.optimizers.schedules.ExponentialDecay(0.4, decay_steps=2, decay_rate=0.5)
    seen, _, trainer = fit(tmp_path, "keras", lr_schedule=decay)
    np.testing.assert_allclose([seen[s] for s in range(1, 5)],
                               [0.4, 0.4 * 0.5 ** 0.5, 0.2, 0.4 * 0.5 ** 1.5], atol=1e-6)
    assert "lr by ExponentialDecay" in trainer.stream.getvalue()
    seen, _, _ = fit(tmp_path, "function", lr_schedule=lambda update: 0.1 / (1.0 + update))
    np.testing.assert_allclose([seen[s] for s in range(1, 4)], [0.1, 0.05, 0.1 / 3], atol=1e-6)


@pytest.mark.parametrize("arguments, message", [
    ({"lr_schedule": "linear"}, "--lr-schedule 'linear' is not one of constant, "
     "step:EPOCHS:FACTOR (step:30:0.1), cosine or poly[:POWER]"),
    ({"lr_schedule": "step:30"}, "--lr-schedule 'step:30' is not one of constant, "
     "step:EPOCHS:FACTOR (step:30:0.1), cosine or poly[:POWER]"),
    ({"lr_schedule": "step:30:2"}, "--lr-schedule step's factor (2) must be between 0 and 1, "
     "e.g. step:30:0.1"),
    ({"lr_schedule": "cosine:x"}, "--lr-schedule 'cosine:x' is not one of constant, "
     "step:EPOCHS:FACTOR (step:30:0.1), cosine or poly[:POWER]"),
    ({"warmup_epochs": -1.0}, "--warmup-epochs (-1) must be 0 or more"),
    ({"lr_schedule": lambda step: 0.1, "warmup_epochs": 1.0}, "--warmup-epochs warms up the "
     "built-in schedules; build the warm-up into your own --lr-schedule"),
])
def test_a_bad_schedule_is_refused_in_one_line(arguments, message):
    with pytest.raises(UsageError) as err:
        schedules.of(arguments.get("lr_schedule", "constant"), arguments.get("warmup_epochs", 0))
    assert flag_message(err.value) == message


def test_a_warm_up_as_long_as_the_run_is_refused_before_tensorflow_starts():
    result = run_cli("tower-train", "--warmup-epochs", "5", "--epochs", "5")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("tower-train: error: --warmup-epochs (5) must be shorter than the "
                             "run (--epochs 5)\n")
