"""The outer loop: epochs of blocks of training steps, and a record of each
epoch. What looks at the run is handed to it: the progress lines, and
watchers (the held-out pass, the metrics file, checkpoints, the non-finite
guard, signals, the user's callbacks); the placement log is the `call` each
step runs through."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import tensorflow as tf

from engine import data
from engine.core.options import LoopOptions
from engine.core.outputs import StepOutputs
from engine.core.progress import EpochProgress, figures
from engine.core.step import TowerStep


def plain_call(kind: str, function: Callable, *args):
    """Runs a step as it is; a placement log replaces this to capture steps."""
    return function(*args)


class HeldOut:
    """The towers' held-out iterators, and how far into a pass they are.

    Every shard is padded to the same number of batches, so the position of
    the next batch in its pass is the same on every tower; it tells which
    samples of each batch are real.
    """

    def __init__(self, iterators, *, size: int, batch_size: int, num_towers: int):
        self.iterators = iterators
        self.size = size
        self.batch_size = batch_size
        self.num_towers = num_towers
        self.position = tf.Variable(0, dtype=tf.int64, trainable=False)

    def evaluate(
        self, step: TowerStep, num_steps: int, call: Callable = plain_call
    ) -> dict[str, float]:
        totals = np.zeros([4 if step.top_k else 3], np.float32)
        for _ in range(num_steps):
            valid = data.valid_counts(
                self.size, self.batch_size, self.num_towers, int(self.position.numpy())
            )
            valid = tf.constant(valid, tf.int32)
            totals += call("eval", step.evaluate, self.iterators, valid).numpy()
            self.position.assign_add(1)
        loss, correct, samples, *top = np.asarray(totals, np.float64).tolist()
        record = {
            "eval_loss": loss / max(samples, 1.0),
            "eval_accuracy": correct / max(samples, 1.0),
            "eval_samples": int(samples),
        }
        if step.top_k:
            record[f"eval_{step.top_k_name}"] = top[0] / max(samples, 1.0)
        return record


class Evaluation:
    """The held-out pass after every epoch, as a watcher: `eval_steps`
    batches per tower, each through `call`, its figures (`eval_loss`,
    `eval_accuracy`, top-k, `eval_seconds`) added to the epoch's record."""

    def __init__(self, step: TowerStep, held_out: HeldOut, eval_steps: int,
                 call: Callable = plain_call):
        self.step, self.held_out, self.eval_steps, self.call = step, held_out, eval_steps, call

    def after_step(self, step: int, outputs: dict) -> None:
        pass

    def complete(self, epoch: int, record: dict) -> None:
        start = time.perf_counter()
        record.update(self.held_out.evaluate(self.step, self.eval_steps, self.call))
        record["eval_seconds"] = time.perf_counter() - start

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        pass


class Watcher(Protocol):
    """Something that looks at the run between steps (checkpoints, the
    non-finite guard, signals, the user's callbacks). Either hook may raise
    to stop the run; a watcher with a true `stop_training` ends it after the
    epoch, as finished.

    Two hooks are optional: `before_first_step(step, steps_per_epoch)`, before
    the first step (the run's step counter: not 0 after a restore), and
    `complete(epoch, record)`, which adds figures to an epoch's record
    before it is shown and the others hear of it (`Evaluation`)."""

    def after_step(self, step: int, outputs: dict) -> None:
        """After every step, in order, with that step's own figures as host
        values: `loss`, `accuracy`, `finite` (per tower), `overflow`,
        `learning_rate` (the rate its update used), `grad_norm` (the reduced
        gradients' global norm before clipping, with `clip_norm`) and
        `block_end`. A call of several steps (`steps_per_loop`) reports its
        steps once it returns; only at its last (`block_end` true) are the
        variables those after the step, where a checkpoint can be saved or
        the run stopped."""
        ...

    def after_epoch(self, epoch: int, step: int, record: dict) -> None: ...


def run(
    step: TowerStep,
    train_iterators,
    options: LoopOptions,
    progress: EpochProgress,
    call: Callable = plain_call,
    watchers: Sequence[Watcher] = (),
    *,
    halt_on_nonfinite: bool = True,
) -> list[dict]:
    """Trains until `options.epochs` epochs are done; returns one record per
    epoch run here.

    Starts from the step counter in `step`, so a restored run continues in
    the middle of the epoch it stopped in. Every step runs as
    `call(kind, function, *args)`, kind `train` (an `Evaluation` watcher's
    calls are `eval`). A record has `eval_loss` and `eval_accuracy` None
    unless a watcher completes them. With
    `halt_on_nonfinite`, a loop of steps leaves no trace after a step whose
    loss or gradient was not finite, and the watchers hear of no step after
    it (the non-finite guard stops the run there); without, it goes on, as
    `skip_nonfinite` does.
    """
    global_batch = step.accumulate * sum(
        int(spec[0].shape[0]) for spec in (it.element_spec for it in train_iterators)
    )
    # Sequences (token ids, [batch, T]) are counted as such, images as images.
    rate = "sequences/s" if train_iterators[0].element_spec[0].shape.rank == 2 else "images/s"
    per_epoch = options.steps_per_epoch
    done = started = int(step.global_step.numpy())
    for watcher in watchers:
        if hasattr(watcher, "before_first_step"):
            watcher.before_first_step(started, per_epoch)
    history = []
    for epoch in range(done // per_epoch + 1, options.epochs + 1):
        progress.start(epoch, options.epochs)
        first = done % per_epoch + 1
        if first == 1:
            step.sums.reset()  # a resumed epoch keeps the sums it restored
        skipped_before = int(step.skipped.numpy())
        start = time.perf_counter()
        # The rate is timed from `timed`, the first step it counts: after the
        # run's first call, which traces the step and (after a restore)
        # waits for the readers, where the epoch has steps after it.
        clock, timed = start, first
        k, learning_rate = first, None
        while k <= per_epoch:
            # The run's first step goes alone: it traces the step, and a
            # placement log captures that single step.
            opening = done == started
            left = 1 if opening else per_epoch - k + 1
            steps = _train_steps(step, train_iterators, call, options, done, left,
                                 halt_on_nonfinite)
            for outputs in steps:
                done += 1
                k += 1
                learning_rate = outputs["learning_rate"]
                for watcher in watchers:
                    watcher.after_step(done, outputs)
            if opening and k <= per_epoch:
                clock, timed = time.perf_counter(), k
            if options.check_replicas and done % options.check_replicas == 0:
                step.variables.check(options.replica_tolerance, done)
            if progress.due() and k <= per_epoch:
                elapsed = time.perf_counter() - clock
                progress.update(
                    k - 1,
                    per_epoch,
                    {**figures(step.sums.averages()),
                     rate: (k - timed) * global_batch / elapsed if k > timed else None},
                )
        end = time.perf_counter()
        seconds = end - start
        record = {"epoch": epoch, **step.sums.averages()}
        record["images_per_sec"] = (per_epoch - timed + 1) * global_batch / (end - clock)
        record["seconds"] = seconds
        record["skipped"] = int(step.skipped.numpy())
        record["learning_rate"] = learning_rate  # the epoch's last step's
        if step.loss_scale.dynamic:
            record["loss_scale"] = float(step.loss_scale.scale.numpy())
            record["overflows"] = int(step.loss_scale.overflows.numpy())
        record.update(eval_loss=None, eval_accuracy=None)
        if step.top_k:
            record[f"eval_{step.top_k_name}"] = None
        for watcher in watchers:
            if hasattr(watcher, "complete"):
                watcher.complete(epoch, record)
        # The epoch's steps that did not update are named: an epoch of only
        # those has no loss to show. `steps` (updated) is exact across a
        # resume; a step skipped before it is counted as an overflow.
        skipped, overflowed = _not_updated(step, per_epoch - record["steps"],
                                           int(step.skipped.numpy()) - skipped_before)
        progress.end(
            per_epoch,
            seconds,
            {
                **figures(record),
                rate: record["images_per_sec"],
                "skipped": skipped or None,
                "loss-scale overflows": overflowed or None,
                **figures(record, "eval_"),
            },
        )
        for watcher in watchers:
            watcher.after_epoch(epoch, done, record)
        history.append(record)
        if any(getattr(watcher, "stop_training", False) for watcher in watchers):
            break  # a watcher (early stopping, say) ends the run after this epoch
    return history


def _train_steps(step: TowerStep, iterators, call, options: LoopOptions, done: int,
                 left: int, halt: bool) -> list[dict]:
    """Runs the next loop: up to the next multiple of `steps_per_loop` (so
    loops end on the same global steps after a resume), at most `left`
    steps; returns each step's outputs (`per_step`)."""
    per_loop = options.steps_per_loop
    count = min(per_loop - done % per_loop, left)
    if count == 1:
        # One step goes as one step: a placement log then captures the
        # step's graph, not a while loop's body.
        return per_step(call("train", step.train, iterators), halt, step.top_k_name)
    return per_step(
        call("train", step.train_loop, iterators, tf.constant(count, tf.int32), halt), halt,
        step.top_k_name)


def per_step(outputs: StepOutputs, halt: bool = True, top_k_name: str | None = None
             ) -> list[dict]:
    """The steps of one call as host values, one dict each (the Watcher's
    `outputs`, the top-k accuracy named `top_k_name`), read from the device
    at once: the outputs of one step (`TowerStep.train`) or of a loop
    (`TowerStep.train_loop`, stacked). With `halt`, none after the first
    step that was neither finite nor a loss-scale overflow: the loop left
    no trace of those."""
    values = {(top_k_name if key == "top_k_accuracy" else key): np.asarray(value)
              for key, value in outputs._asdict().items() if value is not None}
    if values["loss"].ndim == 0:
        values = {key: value[np.newaxis] for key, value in values.items()}
    count = len(values["loss"])
    if halt:
        healthy = values["finite"].all(axis=1) | values["overflow"]
        if not healthy.all():
            count = int(np.argmin(healthy)) + 1
    scalars = [key for key in values if key not in ("finite", "overflow")]
    return [{**{key: float(values[key][i]) for key in scalars},
             "finite": values["finite"][i], "overflow": bool(values["overflow"][i]),
             "block_end": i == count - 1}
            for i in range(count)]


def _not_updated(step: TowerStep, not_updated: int, skipped: int) -> tuple[int, int]:
    """(skipped, loss-scale overflows) of an epoch's `not_updated` steps, of
    which this process saw `skipped` skipped; the rest were overflows."""
    if not step.loss_scale.dynamic:
        return not_updated, 0
    return min(skipped, not_updated), max(0, not_updated - skipped)

