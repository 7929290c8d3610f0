"""Initial weights from a .keras file or a checkpoint of this engine, and the
best checkpoint kept by a held-out figure: the weights loaded equal the
file's, a model of another shape is refused naming the first layer that
differs, and the best epoch is the one the metric says."""

import io
import json
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import flag_message

import towers
from engine.errors import UsageError
from engine.run.watchers import BestCheckpoint, read_best

DEVICES = ["/cpu:0", "/cpu:1"]


def values(model):
    return [v.numpy() for v in model.variables]


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A lenet trained for 3 epochs of 5 steps, its best epoch by eval_accuracy
    kept, its model saved, and its weights after every epoch."""
    folder = tmp_path_factory.mktemp("trained")

    class Weights(towers.callbacks.Callback):
        def __init__(self):
            self.after = []

        def on_epoch_end(self, epoch, logs):
            self.after.append(values(self.trainer.model))

    trainer = towers.Trainer(DEVICES, model="lenet", batch_size=32, stream=io.StringIO())
    weights = Weights()
    history = trainer.fit(epochs=3, steps_per_epoch=5, eval_steps=2, verbose=0,
                          checkpoint_dir=str(folder / "ckpt"), keep_best="val_accuracy",
                          callbacks=[weights])
    trainer.save(str(folder / "latest.keras"))
    return trainer, history, weights.after, folder


@pytest.mark.slow
@pytest.mark.parametrize("source", ["latest.keras", "ckpt", "ckpt/ckpt-10"])
def test_the_weights_loaded_are_the_files(trained, source):
    _, _, after, folder = trained
    epoch = 1 if source.endswith("ckpt-10") else 2  # ckpt-10: the end of epoch 2
    out = io.StringIO()
    trainer = towers.Trainer(DEVICES, model="lenet", batch_size=32,
                             init_weights=str(folder / source), variables="replicated",
                             stream=out)
    trainer.evaluate(steps=1)  # builds the towers, and loads
    for tower in range(2):
        assert_same(values(trainer.built.step.variables.model_for(tower)), after[epoch])
    assert f"initial weights: {folder / source} (10 variables)" in out.getvalue()


@pytest.mark.slow
def test_the_best_epoch_is_the_metrics_best_and_save_writes_its_model(trained):
    trainer, history, after, folder = trained
    best = int(np.argmax([r["eval_accuracy"] for r in history]))
    kept = read_best(str(folder / "ckpt"))
    assert kept == {"metric": "eval_accuracy", "value": history[best]["eval_accuracy"],
                    "epoch": best + 1, "step": 5 * (best + 1),
                    "path": str(folder / "ckpt" / "best" / f"ckpt-{5 * (best + 1)}")}
    latest = values(trainer.model)
    trainer.save(str(folder / "best.keras"), best=True)
    import keras

    assert_same(values(keras.models.load_model(str(folder / "best.keras"))), after[best])
    assert_same(values(trainer.model), latest)  # the trainer keeps its own


def test_the_best_checkpoint_follows_the_metric_and_survives_a_resume(tmp_path):
    variable = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(v=variable)
    said = []
    watcher = BestCheckpoint(checkpoint, str(tmp_path), "eval_loss", said.append)
    for epoch, loss in enumerate([0.9, 0.5, 0.7, None], start=1):
        variable.assign(float(epoch))
        watcher.after_epoch(epoch, 10 * epoch, {"eval_loss": loss})
    assert read_best(str(tmp_path))["epoch"] == 2
    assert said == [f"best: eval_loss 0.9000 at epoch 1: {tmp_path}/best/ckpt-10",
                    f"best: eval_loss 0.5000 at epoch 2: {tmp_path}/best/ckpt-20"]
    # A resumed run goes on from the best so far: 0.6 is no better.
    again = BestCheckpoint(checkpoint, str(tmp_path), "eval_loss", said.append)
    again.after_epoch(5, 50, {"eval_loss": 0.6})
    assert read_best(str(tmp_path))["step"] == 20
    checkpoint.restore(read_best(str(tmp_path))["path"])
    assert variable.numpy() == 2.0
    saved = json.loads((tmp_path / "best" / "best.json").read_text())
    assert saved["value"] == 0.5
    # A fresh run in the same folder keeps its own best, however bad.
    fresh = BestCheckpoint(checkpoint, str(tmp_path), "eval_loss", said.append, resume=False)
    fresh.after_epoch(1, 60, {"eval_loss": 0.8})
    fresh.after_epoch(2, 70, {"eval_loss": float("nan")})  # never a best
    assert read_best(str(tmp_path))["step"] == 60


@pytest.mark.slow
def test_weights_of_another_model_are_refused_naming_the_first_layer_that_differs(trained):
    *_, folder = trained
    with pytest.raises(UsageError) as err:
        trainer = towers.Trainer(DEVICES, model="mlp", init_weights=str(folder / "latest.keras"),
                                 stream=io.StringIO())
        trainer.evaluate(steps=1)
    # Keras numbers a process's layers of one kind: dense, dense_1, ...
    assert re.fullmatch(
        re.escape(f"--init-weights {folder / 'latest.keras'} does not fit --model mlp: "
                  "layer ") + r"dense(_\d+)?" + re.escape(
                      " has a kernel of shape (784, 128), the file's is (5, 5, 1, 6)"),
        flag_message(err.value))


@pytest.mark.parametrize("arguments, fit, message", [
    ({"init_weights": "/no/such.keras"}, None, "--init-weights /no/such.keras: no such file"),
    ({"init_weights": "/tmp"}, None,
     "--init-weights /tmp: not a .keras file (as Trainer.save writes) nor a checkpoint "
     "of this engine (a --checkpoint-dir, or its ckpt-N)"),
    ({}, {"keep_best": "eval_accuracy"}, "--keep-best needs --checkpoint-dir DIR"),
    ({}, {"keep_best": "f1", "checkpoint_dir": "/tmp/x"},
     "--keep-best 'f1' is not a figure of the epoch's record: eval_accuracy, eval_loss, "
     "eval_top5_accuracy, accuracy or loss (Keras' val_ names too)"),
    ({}, {"keep_best": "val_top5_accuracy", "checkpoint_dir": "/tmp/x"},
     "--keep-best val_top5_accuracy: this run reports no top-k accuracy; add "
     "--metrics-top-k 5 or keep the best by another figure"),
    ({}, {"keep_best": "eval_loss", "checkpoint_dir": "/tmp/x", "eval_steps": 0},
     "--keep-best eval_loss is a held-out figure, and this run evaluates on none; add "
     "held-out data or --eval-steps, or keep the best by --keep-best loss"),
])
def test_bad_weights_and_best_arguments_are_refused_in_one_line(arguments, fit, message):
    with pytest.raises(UsageError) as err:
        trainer = towers.Trainer(DEVICES, stream=io.StringIO(), **arguments)
        trainer.fit(epochs=1, verbose=0, **fit)
    assert flag_message(err.value) == message
