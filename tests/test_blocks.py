"""Steps per call (`steps_per_loop`) change nothing a user sees: the same
per-step losses in callbacks and TensorBoard, checkpoints at the steps asked
for, a non-finite step named as itself with the state it left, and an exact
resume from a checkpoint that falls inside a call of the resumed run.

GPU towers choose 25 steps per call; these runs give the counts on CPU towers,
where the same loop runs (and a step compiled whole by XLA on one tower, the
GPU default's program)."""

import json

import numpy as np
import pytest
from test_faults import read_scalars

import towers
from engine.run.guard import NonFiniteError

TOWERS = ["/cpu:0", "/cpu:1"]


class Steps(towers.callbacks.Callback):
    """Records every step's loss as the callback is told it, and can stop
    the run (as a crash would) after a given step."""

    def __init__(self, crash_after: int | None = None):
        self.losses, self.batches, self.crash_after = {}, [], crash_after

    def on_train_batch_end(self, batch, logs):
        self.losses[logs["step"]] = logs["loss"]
        self.batches.append(batch)
        if logs["step"] == self.crash_after:
            raise KeyboardInterrupt(f"crashed after step {logs['step']}")


def fit(tmp_path, name, per_loop, *, epochs=2, devices=TOWERS, crash_after=None, resume=False,
        model="mlp", xla=None, **options):
    """A run of 2 epochs of 8 steps on real MNIST; returns its records (or
    the error that stopped it), the callback, the trainer and its folder."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    trainer = towers.Trainer(devices, model=model, batch_size=32, seed=5, xla=xla,
                             data=towers.data.mnist(), stream=open("/dev/null", "w"))
    steps = Steps(crash_after)
    arguments = dict(epochs=epochs, steps_per_epoch=8, steps_per_loop=per_loop, eval_steps=2,
                     checkpoint_dir=str(folder / "ck"), logdir=str(folder / "tb"),
                     metrics=str(folder / "m.jsonl"), callbacks=[steps], resume=resume,
                     verbose=0, **options)
    try:
        records = trainer.fit(**arguments)
    except (KeyboardInterrupt, NonFiniteError) as stopped:
        records = stopped
    return records, steps, trainer, folder


def weights(trainer):
    return [v.numpy() for v in trainer.model.trainable_variables]


def figures(folder):
    keys = ("epoch", "loss", "accuracy", "eval_loss", "eval_accuracy", "steps", "skipped")
    return [{k: r[k] for k in keys} for r in map(json.loads, open(folder / "m.jsonl"))]


@pytest.mark.slow
@pytest.mark.parametrize("devices", [TOWERS, ["/cpu:0"]], ids=["2-towers", "1-tower-xla"])
def test_steps_per_call_change_nothing_a_user_sees(tmp_path, devices):
    """One step per call against four: with two towers the plain loop, with
    one tower the step compiled whole by XLA (its skip is a select)."""
    xla = len(devices) == 1
    runs = {k: fit(tmp_path, f"k{k}", k, devices=devices, checkpoint_every=4, xla=xla)
            for k in (1, 4)}
    (_, one, one_trainer, one_folder), (_, four, four_trainer, four_folder) = (
        runs[1], runs[4])
    assert sorted(one.losses) == sorted(four.losses) == list(range(1, 17))
    assert four.losses == one.losses  # every step's own loss, bit for bit
    assert four.batches == one.batches == [*range(8), *range(8)]
    tensorboard = [read_scalars(f / "tb")["train/loss"] for f in (one_folder, four_folder)]
    assert [s for s, _ in tensorboard[1]] == list(range(1, 17))
    np.testing.assert_array_equal(*(np.array([v for _, v in t]) for t in tensorboard))
    assert figures(four_folder) == figures(one_folder)
    saved = [sorted(p.name for p in (f / "ck").glob("ckpt-*.index")) for f in (one_folder,
                                                                                four_folder)]
    assert saved[0] == saved[1] == ["ckpt-12.index", "ckpt-16.index", "ckpt-8.index"]
    for a, b in zip(weights(one_trainer), weights(four_trainer)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_non_finite_step_inside_a_call_is_named_and_leaves_its_own_state(tmp_path):
    """Tower 1 goes non-finite at step 6. With 4 steps per call, step 6 is
    the second step of the call of steps 5-8: the run stops there, naming
    step 6, with the state one step per call leaves (steps 7 and 8 leave no
    trace), the same steps reported, and step 4's checkpoint the last."""
    runs = {k: fit(tmp_path, f"nan{k}", k, epochs=1, checkpoint_every=4,
                   model="tests.user_models:nan_on_tower_1_at_step_6") for k in (1, 4)}
    (one, one_steps, one_trainer, _), (four, four_steps, four_trainer, _) = runs[1], runs[4]
    assert isinstance(four, NonFiniteError) and str(four) == str(one) == (
        "step 6: the loss or a gradient of tower 1 (/cpu:1) is not finite; the update was "
        "not applied")
    assert four.checkpoint.endswith("/ck/ckpt-4") and one.checkpoint.endswith("/ck/ckpt-4")
    assert sorted(four_steps.losses) == sorted(one_steps.losses) == [1, 2, 3, 4, 5]
    step = [t.built.step for t in (one_trainer, four_trainer)]
    assert [int(s.global_step.numpy()) for s in step] == [6, 6]
    assert [int(s.skipped.numpy()) for s in step] == [1, 1]
    for a, b in zip(weights(one_trainer), weights(four_trainer)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_resume_from_a_checkpoint_inside_a_call_is_exact(tmp_path):
    """A run of two steps per call saves at step 6 and crashes; resumed with
    four steps per call, step 6 falls inside the call of steps 5-8, so the
    resumed run takes 7 and 8, then 9-12, ...: its losses and weights are
    those of a run of four steps per call that never stopped."""
    _, whole, whole_trainer, _ = fit(tmp_path, "whole", 4, checkpoint_every=4)
    _, crashed, _, folder = fit(tmp_path, "resumed", 2, checkpoint_every=2, crash_after=6)
    assert max(crashed.losses) == 6 and (folder / "ck" / "ckpt-6.index").exists()
    records, resumed, trainer, _ = fit(tmp_path, "resumed", 4, checkpoint_every=4, resume=True)
    assert sorted(resumed.losses) == list(range(7, 17))
    assert resumed.losses == {s: v for s, v in whole.losses.items() if s > 6}
    assert {**crashed.losses, **resumed.losses} == whole.losses
    for a, b in zip(weights(whole_trainer), weights(trainer)):
        np.testing.assert_array_equal(a, b)
    assert [r["epoch"] for r in records] == [1, 2]


@pytest.mark.parametrize("gpus, every, want", [
    (True, (0, 0), 25), (True, (40, 0), 20), (True, (7, 0), 7), (True, (50, 30), 10),
    (True, (100, 0), 25), (False, (0, 0), 1), (False, (40, 0), 1)])
def test_the_chosen_steps_per_call_divide_the_checkpoint_and_replica_cadence(gpus, every, want):
    from engine.errors import render
    from engine.run import choices
    from towers.cli.train import FLAGS

    choice = choices.steps_per_loop(gpus, every=every)
    assert choice.value == want
    if gpus:
        assert render(choice.reason, FLAGS).endswith("(--steps-per-loop 1 for one)")
        assert ("a divisor of the checkpoint" in choice.reason) == (want < 25)
