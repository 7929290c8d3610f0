"""Top-k accuracy: counted as by hand (the label among the k largest
outputs, padding left out), reported per step and per epoch, on by default
from 100 classes, and a k that counts nothing is refused."""

import io

import numpy as np
import pytest
import tensorflow as tf
from conftest import flag_message

import towers
from engine.core.tower import count_correct
from engine.errors import UsageError


def test_a_sample_counts_when_its_label_is_among_the_k_largest_outputs():
    outputs = tf.constant([[0.1, 0.5, 0.3, 0.1],    # label 2: second largest
                           [0.7, 0.1, 0.15, 0.05],  # label 3: the smallest
                           [0.2, 0.2, 0.5, 0.1]])   # label 2: the largest
    labels = tf.constant([2, 3, 2])
    assert count_correct(labels, outputs).numpy().tolist() == [0.0, 0.0, 1.0]
    assert count_correct(labels, outputs, 2).numpy().tolist() == [1.0, 0.0, 1.0]
    # One label per position: the fraction of a sample's positions.
    per_position = tf.stack([outputs, outputs])  # [2 samples, 3 positions, 4]
    got = count_correct(tf.stack([labels, labels]), per_position, 2).numpy()
    np.testing.assert_allclose(got, [2 / 3, 2 / 3])


class StepLogs(towers.callbacks.Callback):
    def __init__(self):
        self.logs = []

    def on_train_batch_end(self, batch, logs):
        self.logs.append(dict(logs))


@pytest.fixture(scope="module")
def trained():
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], model="lenet", batch_size=32, metrics_top_k=3,
                             stream=io.StringIO())
    steps = StepLogs()
    record, = trainer.fit(epochs=1, steps_per_epoch=4, eval_steps=1, callbacks=[steps],
                          verbose=0)
    return trainer, record, steps.logs


@pytest.mark.slow
def test_the_held_out_top_k_is_the_hand_count_of_the_real_samples(trained):
    trainer, _, _ = trained
    rng = np.random.default_rng(3)
    images = rng.random((2, 32, 28, 28, 1), np.float32)
    labels = rng.integers(0, 10, (2, 32, 1)).astype(np.int32)
    iterators = [iter(tf.data.Dataset.from_tensors((images[k], labels[k])).repeat())
                 for k in range(2)]
    valid = [30, 32]  # tower 0's last two samples are padding
    loss, correct, samples, top = trainer.built.step.evaluate(
        iterators, tf.constant(valid)).numpy()
    hand_top, hand_correct = 0, 0
    for k in range(2):
        outputs = trainer.model(images[k], training=False).numpy()[:valid[k]]
        truth = labels[k, :valid[k], 0]
        hand_top += sum(t in np.argsort(row)[-3:] for row, t in zip(outputs, truth))
        hand_correct += int((outputs.argmax(axis=1) == truth).sum())
    assert samples == 62
    assert (correct, top) == (hand_correct, hand_top)
    assert top > correct  # the top-3 count is not the top-1 count


@pytest.mark.slow
def test_top_k_is_in_the_step_logs_the_record_and_the_held_out_figures(trained):
    _, record, logs = trained
    assert [round(x["top3_accuracy"] * 64) for x in logs] == [
        pytest.approx(x["top3_accuracy"] * 64) for x in logs]  # counts of 64 samples
    assert record["top3_accuracy"] == pytest.approx(
        np.mean([x["top3_accuracy"] for x in logs]))
    assert record["top3_accuracy"] >= record["accuracy"]
    assert record["eval_top3_accuracy"] >= record["eval_accuracy"]
    assert 0 < record["eval_top3_accuracy"] <= 1


def test_top_5_is_on_by_default_from_100_classes_and_off_below():
    hundred = towers.Trainer(["/cpu:0", "/cpu:1"], data=towers.data.synthetic(num_classes=100),
                             stream=io.StringIO())
    assert hundred.options.model.metrics_top_k == 5
    mnist = towers.Trainer(["/cpu:0", "/cpu:1"], stream=io.StringIO())
    assert mnist.options.model.metrics_top_k == 0


@pytest.mark.parametrize("value, message", [
    (-1, "--metrics-top-k (-1) must be 0 (none) or more (5 for top-5 accuracy)"),
    (10, "--metrics-top-k (10) must be below the number of classes (10), or 0 for none"),
])
def test_a_k_that_counts_nothing_is_refused(value, message):
    with pytest.raises(UsageError) as err:
        towers.Trainer(["/cpu:0", "/cpu:1"], metrics_top_k=value, stream=io.StringIO())
    assert flag_message(err.value) == message


@pytest.mark.slow
def test_a_checkpoint_without_top_k_resumes_into_a_run_with_it(tmp_path):
    first = towers.Trainer(["/cpu:0", "/cpu:1"], model="lenet", batch_size=32,
                           stream=io.StringIO())
    first.fit(epochs=1, steps_per_epoch=3, eval_steps=1, checkpoint_dir=str(tmp_path),
              verbose=0)
    again = towers.Trainer(["/cpu:0", "/cpu:1"], model="lenet", batch_size=32,
                           metrics_top_k=3, stream=io.StringIO())
    record, = again.fit(epochs=2, steps_per_epoch=3, eval_steps=1,
                        checkpoint_dir=str(tmp_path), resume=True, verbose=0)
    assert record["epoch"] == 2 and record["top3_accuracy"] >= record["accuracy"]
