"""What watches a run between steps besides the loop itself: checkpoints,
signals, and the replay that puts GPU readers back after a restore."""

from __future__ import annotations

import json
import math
import os

from engine import data
from engine.core.options import LoopOptions
from engine.run.build import BuiltRun
from engine.run.checkpoint import Checkpoints, replay
from engine.run.signals import GracefulStop
from engine.topology.devices import Placement


def unguarded(what: str, function, *args):
    """Runs `function(*args)`: a guard without a deadline, where no watchdog is."""
    return function(*args)


class CheckpointWatcher:
    """Saves every `checkpoint_every` steps and at the end of every epoch.

    A step that ends an epoch is saved after the epoch's evaluation, so the
    checkpoint holds the held-out position after it, not before.
    """

    def __init__(self, checkpoints: Checkpoints, steps_per_epoch: int, say, guard=None):
        self.checkpoints = checkpoints
        self.guard = guard or unguarded
        self.steps_per_epoch = steps_per_epoch
        self.say = say
        self.saved_at = -1

    def save(self, step: int) -> str:
        if step != self.saved_at:
            self.guard("saving a checkpoint", self.checkpoints.save, step)
            self.saved_at = step
        return self.checkpoints.latest

    def after_step(self, step: int, outputs: dict) -> None:
        if (outputs["block_end"] and self.checkpoints.should_save(step)
                and step % self.steps_per_epoch):
            self.save(step)

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        self.say(f"checkpoint: {self.save(step)}")


class BestCheckpoint:
    """Keeps the checkpoint of the epoch with the best `metric` in
    `directory`/best (one checkpoint, the run's whole state, as the
    latest ones), and what it holds in `directory`/best/best.json: the
    metric, its value, the epoch and the step. A resumed run goes on
    from the best value it had."""

    def __init__(self, checkpoint, directory: str, metric: str, say, io=None, guard=None,
                 resume: bool = True):
        import tensorflow as tf

        self.metric = metric
        self.say = say
        self.io = io
        self.guard = guard or unguarded
        self.directory = os.path.join(directory, "best")
        self.manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=1)
        # +1: larger is better (accuracies), -1: smaller (losses).
        self.sign = 1.0 if metric.endswith("accuracy") else -1.0
        # A fresh run in a used folder starts its own best; a resumed one
        # goes on from the best it had.
        self.best = read_best(directory) if resume else None

    def after_step(self, step: int, outputs: dict) -> None:
        pass

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        value = record.get(self.metric)
        if value is None or not math.isfinite(value):  # no step updated, no evaluation
            return
        if self.best is not None and self.best["metric"] == self.metric and not (
                self.sign * (value - self.best["value"]) > 0):
            return
        path = self.guard("saving the best checkpoint", lambda: self.manager.save(
            checkpoint_number=step, options=self.io))
        self.best = {"metric": self.metric, "value": value, "epoch": epoch, "step": step,
                     "path": path}
        with open(os.path.join(self.directory, BEST_FILE), "w") as out:
            json.dump(self.best, out)
            out.write("\n")
        self.say(f"best: {self.metric} {value:.4f} at epoch {epoch}: {path}")


BEST_FILE = "best.json"


def read_best(directory: str) -> dict | None:
    """What `directory`/best holds (BestCheckpoint), or None."""
    path = os.path.join(directory, "best", BEST_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as saved:
        return json.load(saved)


class SignalWatcher:
    """Stops the run at the first safe point after a signal: after a step
    inside an epoch, or after an epoch's evaluation, metrics and checkpoint.
    A signal during the last epoch's end lets the finished run finish."""

    def __init__(self, stop: GracefulStop, options: LoopOptions):
        self.stop = stop
        self.options = options

    def after_step(self, step: int, outputs: dict) -> None:
        if outputs["block_end"] and step % self.options.steps_per_epoch:
            self.stop.check(step)

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        if epoch < self.options.epochs:
            self.stop.check(step)


def replay_gpu_readers(placement: Placement, built: BuiltRun, say, guard=None) -> str:
    """Puts the GPU towers' readers where the restored run left them, by
    reading and dropping the batches it had taken; returns what to add to
    the resume line.

    Every train step takes `accumulate` batches per tower (one without
    accumulation), so the run had taken `global_step` times that; a
    held-out pass is `eval_batches` batches and repeats, so only the
    position within it is replayed.
    """
    gpu = [t for t in placement.towers if t.gpu_index is not None]
    if not gpu:
        return ""
    devices = [t.device for t in gpu]
    steps = int(built.step.global_step.numpy())
    splits = [(built.train_iterators, steps * built.step.accumulate)]
    held_out = built.held_out
    if held_out is not None:
        per_pass = data.eval_batches(held_out.size, held_out.batch_size, held_out.num_towers)
        splits.append((held_out.iterators, int(held_out.position.numpy()) % per_pass))
    total = sum(batches for _, batches in splits)
    if total >= REPLAY_PROGRESS:
        say(f"replaying {total:,} batches on the GPU towers' readers to the saved position")
    before = 0
    for iterators, batches in splits:
        def progress(done: int, before: int = before) -> None:
            if total >= REPLAY_PROGRESS:
                say(f"  {before + done:,}/{total:,} batches")

        replay([iterators[t.index] for t in gpu], devices, batches, progress, guard=guard)
        before += batches
    names = ", ".join(str(t.index) for t in gpu)
    return (f"; GPU tower{'s' * (len(gpu) > 1)} {names} replayed {total:,} batches to "
            "that data position (DALI cannot save a GPU pipeline's position)")


# Replays shorter than this many batches take about a second; longer ones
# show progress.
REPLAY_PROGRESS = 2000
