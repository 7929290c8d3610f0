"""The outer loop with --steps-per-loop: which steps each call runs, and what
the watchers and the progress line see. A fake step records its calls."""

import io
import json
import time

import pytest
import tensorflow as tf
from conftest import flag_message

from engine.core import loop
from engine.core.options import LoopOptions
from engine.core.outputs import StepOutputs
from engine.core.progress import EpochProgress, MetricsFile


class FakeStep:
    """Counts steps like TowerStep and records how many each call ran."""

    accumulate = 1  # batches per tower per step
    top_k = 0  # no top-k accuracy

    def __init__(self, done: int = 0):
        self.global_step = tf.Variable(done, dtype=tf.int64)
        self.skipped = tf.Variable(0, dtype=tf.int64)
        self.loss_scale = type("NoScale", (), {"dynamic": False})()
        self.calls = []

    top_k_name = None
    sums = type("Sums", (), {"reset": lambda self: None,
                             "averages": lambda self: {"steps": 0, "loss": 1.0,
                                                       "accuracy": 0.5}})()

    def _run(self, count):
        self.calls.append(count)
        self.global_step.assign_add(count)
        return StepOutputs(loss=tf.ones([count]), accuracy=tf.fill([count], 0.5),
                           finite=tf.ones([count, 1], tf.bool),
                           overflow=tf.zeros([count], tf.bool),
                           learning_rate=tf.fill([count], 0.1))

    def train(self, iterators):
        return StepOutputs(*(None if v is None else v[0] for v in self._run(1)))

    def train_loop(self, iterators, count, halt=True):
        return self._run(int(count))


class Steps:
    """A watcher that records the global step after every call."""

    def __init__(self):
        self.seen = []

    def after_step(self, step, outputs):
        if outputs["block_end"]:
            self.seen.append(step)

    def after_epoch(self, epoch, step, record):
        pass


def run(step, per_loop, epochs=2, per_epoch=10):
    batch = (tf.zeros([4, 1]), tf.zeros([4, 1], tf.int32))
    iterators = [iter(tf.data.Dataset.from_tensors(batch).repeat())]
    watcher, stream = Steps(), io.StringIO()
    options = LoopOptions(epochs=epochs, steps_per_epoch=per_epoch, eval_steps=0,
                               steps_per_loop=per_loop)
    records = loop.run(step, iterators, options, EpochProgress(stream, interval=0),
                       watchers=[watcher])
    return records, watcher.seen, stream.getvalue()


def test_loops_end_on_multiples_of_k_and_at_epoch_ends():
    step = FakeStep()
    records, seen, out = run(step, per_loop=4)
    # Step 1 alone (it traces the step), then loops up to multiples of 4,
    # clipped at each epoch's end (10, 20).
    assert step.calls == [1, 3, 4, 2, 2, 4, 4]
    assert seen == [1, 4, 8, 10, 12, 16, 20]
    assert [r["epoch"] for r in records] == [1, 2]
    # The live line counts the epoch's steps done after each loop.
    live = [line.split(" ")[0] for line in out.splitlines() if "━" in line]
    assert live[:3] == ["1/10", "4/10", "8/10"]


def test_a_resumed_run_goes_on_from_its_step_on_the_same_multiples():
    step = FakeStep(done=6)
    records, seen, _ = run(step, per_loop=4, epochs=1)
    assert step.calls == [1, 1, 2]  # 7 alone, then up to 8, then 9-10
    assert seen == [7, 8, 10]
    assert [r["epoch"] for r in records] == [1]


def test_one_step_per_call_is_the_plain_step():
    step = FakeStep()
    _, seen, _ = run(step, per_loop=1, epochs=1, per_epoch=3)
    assert step.calls == [1, 1, 1] and seen == [1, 2, 3]


@pytest.mark.parametrize("per_loop, calls", [(3, [1, 2, 3, 1]), (100, [1, 6])])
def test_loops_never_cross_an_epoch(per_loop, calls):
    step = FakeStep()
    run(step, per_loop=per_loop, epochs=1, per_epoch=7)
    assert step.calls == calls


@pytest.mark.parametrize(
    "options, message",
    [
        ({"steps_per_loop": 0}, "--steps-per-loop (0) must be a positive integer"),
        ({"steps_per_loop": 4, "check_replicas": 6},
         "--check-replicas 6 is not a multiple of --steps-per-loop 4; the replicas are "
         "compared between loops"),
    ],
)
def test_loop_options_refuse_what_loops_cannot_do(options, message):
    with pytest.raises(ValueError) as err:
        LoopOptions(epochs=1, steps_per_epoch=10, eval_steps=0, **options)
    assert flag_message(err.value) == message


def test_the_first_epoch_times_its_rate_after_the_runs_first_call():
    """The first call of a run traces the step and, after a resume, waits for
    the readers to be restored: a second of it does not lower images/s."""
    step = FakeStep(done=5)
    first = []

    def slow_first_call(kind, function, *args):
        if not first:
            first.append(kind)
            time.sleep(1.0)
        return function(*args)

    batch = (tf.zeros([4, 1]), tf.zeros([4, 1], tf.int32))
    iterators = [iter(tf.data.Dataset.from_tensors(batch).repeat())]
    options = LoopOptions(epochs=1, steps_per_epoch=10, eval_steps=0)
    record, = loop.run(step, iterators, options, EpochProgress(io.StringIO()),
                       slow_first_call)
    assert record["seconds"] > 1.0  # the epoch's time counts the first call
    # Steps 7-10 (4 of 4 images) in far less than the second the first took.
    assert record["images_per_sec"] > 10 * 16 / record["seconds"]


def test_a_resumed_run_drops_only_the_metrics_lines_it_writes_again(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"epoch": 1, "run": "old"}, {"epoch": 2, "run": "old"},
             {"epoch": 1, "run": "new"}, {"epoch": 2, "run": "new"}, {"epoch": 3, "run": "new"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # Resumed in epoch 2: the new run's lines of epochs 2 and 3 go, the rest stay.
    assert MetricsFile(str(path)).resume_at(2) == 2
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines[:3]
    assert MetricsFile(str(path)).resume_at(5) == 0


def test_a_resumed_run_prunes_the_scalars_past_its_checkpoint(tmp_path):
    from tensorflow.core.util import event_pb2

    from engine.run.summaries import prune_after

    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step in range(1, 11):
            tf.summary.scalar("train/loss", float(step), step=step)
    writer.close()
    assert prune_after(str(tmp_path), 6) == 4
    steps = [event_pb2.Event.FromString(r.numpy()).step
             for path in tmp_path.glob("events.out.tfevents.*")
             for r in tf.data.TFRecordDataset(str(path))
             if event_pb2.Event.FromString(r.numpy()).summary.value]
    assert steps == [1, 2, 3, 4, 5, 6]
