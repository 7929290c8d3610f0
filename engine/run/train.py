"""Trains built towers: restores a checkpoint if asked, runs the loop with
its watchers, and reports the placement log.

Everything here takes option objects; nothing reads flags or the environment.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import TextIO

import tensorflow as tf

from engine import data, errors, reducers
from engine.core import loop
from engine.errors import UsageError
from engine.placement import report as placement_report
from engine.placement.log import PlacementLog
from engine.run.build import ModelOptions, Towers, build
from engine.run.checkpoint import (
    CheckpointError,
    CheckpointOptions,
    Checkpoints,
    saveable_iterators,
)
from engine.run.describe import describe, run_info, run_signature
from engine.run.guard import NonFiniteError, NonFiniteGuard
from engine.run.progress import EpochProgress
from engine.run.signals import GracefulStop, StopRequested
from engine.run.summaries import Summaries
from engine.run.watchdog import Watchdog
from engine.run.watchers import (
    CheckpointWatcher,
    SignalWatcher,
    replay_gpu_readers,
    unguarded,
)
from engine.topology.devices import Placement


@dataclasses.dataclass(frozen=True)
class PlacementOptions:
    """What to record about placement.

    Attributes:
      log_path: JSON Lines file for the runtime placement of the first train
        and eval steps, or None.
      strict: stop after the first captured step if any tower op ran outside
        its tower's device.
      max_transfer_bytes: stop after the first captured train step if it
        moved more bytes between devices than this.
      timings: profile the second call of each captured step for the log's
        timeline, memory and step analysis.
    """

    log_path: str | None = None
    strict: bool = False
    max_transfer_bytes: int | None = None
    timings: bool = True

    def __post_init__(self):
        if self.max_transfer_bytes is not None and (
            not isinstance(self.max_transfer_bytes, int) or self.max_transfer_bytes < 0
        ):
            raise UsageError(
                f"<max_transfer_bytes={self.max_transfer_bytes}> is not a byte count; "
                "give an integer >= 0"
            )

    @property
    def capture(self) -> bool:
        return self.log_path is not None or self.strict or self.max_transfer_bytes is not None


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """Everything the CLI decided, in one place for `train`."""

    data: data.DataOptions
    model: ModelOptions
    reducer: reducers.ReducerOptions
    loop: loop.LoopOptions
    placement: PlacementOptions = PlacementOptions()
    checkpoints: CheckpointOptions = CheckpointOptions()
    skip_nonfinite: bool = False
    logdir: str | None = None
    profile_steps: tuple[int, int] | None = None
    choices: tuple = ()  # engine.run.choices.Choice: settings the run picked itself

    def __post_init__(self):
        per_loop = self.loop.steps_per_loop
        if self.checkpoints.every % per_loop:
            raise UsageError(
                f"<checkpoint_every={self.checkpoints.every}> is not a multiple of "
                f"<steps_per_loop={per_loop}>; checkpoints are saved between loops"
            )


def train(
    placement: Placement,
    options: TrainOptions,
    info: data.DatasetInfo,
    stream: TextIO = sys.stdout,
    stop: GracefulStop | None = None,
    watchdog: Watchdog | None = None,
    towers: Towers | None = None,
    render: Callable[[str], str] = errors.render,
) -> list[dict]:
    """Builds the towers (unless given), restores a checkpoint if asked, and
    runs the loop until `options.loop.epochs` epochs are done in all.

    Args:
      placement: the towers' devices and the reduce device.
      options: everything the run does.
      info: what the data holds (engine.data.inspect).
      stream: where the header, progress and summaries go.
      stop: stops the run at the next safe point after a signal.
      watchdog: with a cluster, every step, the building of the towers and
        every checkpoint save and restore run under its deadline.
      towers: towers built earlier (by `build`) to go on training.
      render: renders the argument markers of the header's choices
        (engine.errors.render: Python terms).

    Returns:
      One record per epoch run here.

    Raises:
      StopRequested: a signal stopped the run (after a checkpoint was saved).
      NonFiniteError: a loss or gradient was not finite (nothing saved).
      CheckpointError: `resume` found checkpoints it cannot use.
    """
    # Work that talks to other tasks runs under the watchdog's deadline.
    guard = watchdog.guard if watchdog else unguarded
    if towers is None:
        towers = guard(
            "building the towers", build,
            placement, options.data, options.model, options.reducer, info.val_size,
        )
    model = towers.step.model
    print(render(describe(placement, options, model, info, towers.step.reducer)),
          file=stream, flush=True)

    def say(message: str) -> None:
        print(message, file=stream, flush=True)

    watchers = [NonFiniteGuard(placement.devices, skip=options.skip_nonfinite, say=say)]
    saver = None
    if options.checkpoints.directory:
        signature = run_signature(placement, options)
        run = tf.Variable(signature, trainable=False)
        state = {**towers.step.trackables(), "run": run,
                 "train_data": saveable_iterators(placement.towers, towers.train_iterators)}
        if towers.held_out is not None:
            state["held_out"] = [
                *saveable_iterators(placement.towers, towers.held_out.iterators),
                towers.held_out.position,
            ]
        checkpoints = Checkpoints(options.checkpoints, state, warn=lambda m: say(f"warning: {m}"))
        if options.checkpoints.resume:
            path = guard("restoring a checkpoint", checkpoints.restore)
            saved = run.numpy().decode()
            if path and saved != signature:
                raise CheckpointError(
                    f"<resume>: {path} was written by a run with {saved}; this run has "
                    f"{signature}; resume with the same <devices>, <batch_size>, <data> "
                    "and <model>"
                )
            if path:
                say(f"resumed from {path} at step {int(towers.step.global_step.numpy())}"
                    + replay_gpu_readers(placement, towers, say, guard))
            else:
                say(f"--resume: no checkpoint in {options.checkpoints.directory} yet; "
                    "starting from the beginning")
        saver = CheckpointWatcher(checkpoints, options.loop.steps_per_epoch, say, guard)
        watchers.append(saver)
    summaries = None
    if options.logdir:
        summaries = Summaries(
            options.logdir, options.profile_steps, int(towers.step.global_step.numpy()),
            options.loop.steps_per_loop,
        )
        watchers.append(summaries)
    if stop is not None:
        watchers.append(SignalWatcher(stop, options.loop))

    log = None
    call = loop.plain_call
    if options.placement.capture:
        log = PlacementLog(
            options.placement.log_path,
            run_info(placement, options, model, towers.step.reducer),
            strict=options.placement.strict,
            timings=options.placement.timings and options.placement.log_path is not None,
            max_transfer_bytes=options.placement.max_transfer_bytes,
        )
        call = log.call
    if watchdog is not None:
        call = watchdog.wrap_call(call)
    try:
        history = loop.run(
            towers.step,
            towers.train_iterators,
            towers.held_out,
            options.loop,
            EpochProgress(stream),
            call,
            watchers,
        )
    except StopRequested as stopped:
        stopped.checkpoint = saver.save(stopped.step) if saver else None
        raise
    except NonFiniteError as err:
        err.checkpoint = saver.checkpoints.latest if saver else None
        raise
    finally:
        if summaries:
            summaries.close()
    if options.placement.log_path:
        print(placement_report.summary(log.entries), file=stream)
        for note in log.notes:
            print(f"placement log: {note}", file=stream)
        print(f"placement log: {options.placement.log_path}", file=stream, flush=True)
        if options.logdir:
            from engine.placement import tensorboard

            written = tensorboard.write(options.logdir, log.metadata, log.entries)
            print(f"placement in TensorBoard: {written} (Graphs, tag placement/train; "
                  "Color: Device or Compute time)", file=stream, flush=True)
    return history
