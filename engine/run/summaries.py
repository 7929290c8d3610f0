"""TensorBoard scalars for long runs, and a profiler trace of chosen steps.

Every step: `train/loss`, `train/accuracy`, `train/learning_rate` (the rate
its update used), with `clip_norm` `train/grad_norm` (before clipping), with
`metrics_top_k` `train/top5_accuracy` (for k=5), and
`train/step_seconds` (wall time between steps, all towers together; with
`steps_per_loop` K, each step of a loop gets the loop's mean). Every epoch: `epoch/loss`,
`epoch/accuracy` and `epoch/top5_accuracy` (unless no step of it updated),
`epoch/images_per_sec`, `epoch/skipped` and, with evaluation, `eval/loss`,
`eval/accuracy` and `eval/top5_accuracy`. Per-tower timing is not taken
in the step itself (a timestamp op is stateful, and tf.function would order
the towers' timestamps one after another, serialising the towers); the
profiler trace of `profile_steps` (A, B) shows each device's timeline
instead, in TensorBoard's Profile tab.
"""

from __future__ import annotations

import glob
import os
import time

import tensorflow as tf

from engine.core.progress import STEP_FLAGS, figures


class Summaries:
    """A loop watcher that writes TensorBoard event files under `logdir`."""

    def __init__(self, logdir: str, profile: tuple[int, int] | None, first_step: int,
                 steps_per_loop: int = 1):
        self.logdir = logdir
        self.steps_per_loop = steps_per_loop
        if first_step:
            prune_after(logdir, first_step)
        self.writer = tf.summary.create_file_writer(logdir)
        self.profile = profile
        self.profiling = False
        self._last = time.perf_counter()
        self._block = []  # the steps of the loop being reported
        if profile and profile[0] <= first_step + 1 <= profile[1]:
            self._start_profile()

    def _start_profile(self) -> None:
        tf.profiler.experimental.start(self.logdir)
        self.profiling = True

    def after_step(self, step: int, outputs: dict) -> None:
        self._block.append((step, outputs))
        if not outputs["block_end"]:
            return
        now = time.perf_counter()
        seconds = (now - self._last) / len(self._block)
        for number, values in self._block:
            with self.writer.as_default(step=number):
                for key, value in values.items():
                    if key not in STEP_FLAGS:
                        tf.summary.scalar(f"train/{key}", value)
                tf.summary.scalar("train/step_seconds", seconds)
        self._block = []
        if self.profile:
            # Steps come in loops of `steps_per_loop` that end on its
            # multiples: the trace covers every loop that holds a step of
            # first to last.
            first, last = self.profile
            loop_end = step + self.steps_per_loop - step % self.steps_per_loop
            if not self.profiling and step + 1 <= last and loop_end >= first:
                self._start_profile()
            elif self.profiling and step >= last:
                tf.profiler.experimental.stop()
                self.profiling = False
        self._last = time.perf_counter()

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        with self.writer.as_default(step=step):
            epoch = {**figures(record), "images_per_sec": record["images_per_sec"],
                     "skipped": record["skipped"]}
            held_out = {key.removeprefix("eval_"): value
                        for key, value in figures(record, "eval_").items()}
            for group, values in (("epoch", epoch), ("eval", held_out)):
                for key, value in values.items():
                    if value is not None:  # no step of the epoch updated, no evaluation
                        tf.summary.scalar(f"{group}/{key}", value)
        self.writer.flush()

    def close(self) -> None:
        if self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False
        self.writer.close()


def prune_after(logdir: str, step: int) -> int:
    """Drops, from the event files in `logdir`, the scalars of steps after
    `step`: a run resumed from the checkpoint of `step` writes them again,
    and TensorBoard would show both. Returns how many were dropped. A file
    cut short by a killed process keeps what it held before the cut.
    """
    from tensorflow.core.util import event_pb2

    dropped = 0
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        kept, seen = [], 0
        try:
            for record in tf.data.TFRecordDataset(path):
                seen += 1
                event = event_pb2.Event.FromString(record.numpy())
                if not (event.HasField("summary") and event.step > step):
                    kept.append(record.numpy())
        except tf.errors.DataLossError:
            seen += 1  # the tail a killed writer left half-written
        if len(kept) == seen:
            continue
        dropped += seen - len(kept)
        with tf.io.TFRecordWriter(path + ".tmp") as out:
            for record in kept:
                out.write(record)
        os.replace(path + ".tmp", path)
    return dropped
