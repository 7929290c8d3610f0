"""Trains built towers: restores a checkpoint if asked, runs the loop with
its watchers, and reports the placement log.

Everything here takes option objects; nothing reads flags or the environment.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

import tensorflow as tf

from engine import data
from engine.core import loop
from engine.core.progress import EpochProgress, MetricsFile, Voice
from engine.placement import summary as placement_summary_lib
from engine.placement.log import PlacementLog
from engine.run import outputs
from engine.run.build import BuiltRun, build
from engine.run.checkpoint import (
    Checkpoints,
    saveable_iterators,
    saved_signature,
)
from engine.run.describe import check_signature, describe, run_info, run_signature
from engine.run.guard import NonFiniteError, NonFiniteGuard
from engine.run.options import TrainOptions
from engine.run.outputs import OutputError
from engine.run.signals import GracefulStop, StopRequested
from engine.run.summaries import Summaries
from engine.run.watchdog import Watchdog
from engine.run.watchers import (
    BestCheckpoint,
    CheckpointWatcher,
    SignalWatcher,
    replay_gpu_readers,
    unguarded,
)
from engine.topology.devices import Placement


def train(
    placement: Placement,
    options: TrainOptions,
    info: data.DatasetInfo,
    stream: TextIO = sys.stdout,
    stop: GracefulStop | None = None,
    watchdog: Watchdog | None = None,
    built: BuiltRun | None = None,
    *,
    voice: Voice | None = None,
    verbose: int = 1,
    watchers: Sequence = (),
    placement_summary: bool = True,
) -> list[dict]:
    """Builds the towers (unless given), restores a checkpoint if asked, and
    runs the loop until `options.loop.epochs` epochs are done in all.

    Args:
      placement: the towers' devices and the reduce device.
      options: everything the run does.
      info: what the data holds (engine.data.inspect).
      stream: where the progress lines go.
      stop: stops the run at the next safe point after a signal.
      watchdog: with a cluster, every step, the building of the towers and
        every checkpoint save and restore run under its deadline.
      built: a run built earlier (by `build`) to go on training.
      voice: how the header, notes and warnings are said (default: in
        Python terms, on `stream`).
      verbose: 0 prints nothing but warnings, 1 the header and a live
        progress line, 2 the header and one line per epoch.
      watchers: more of the loop's watchers (engine.core.loop.Watcher), after
        the run's own; one whose `stop_training` turns true ends the run
        after the epoch.
      placement_summary: with a placement log, print its summary at the end.

    Returns:
      One record per epoch run here.

    Raises:
      UsageError: `resume` into a run of other settings (nothing is built).
      StopRequested: a signal stopped the run (after a checkpoint was saved).
      NonFiniteError: a loss or gradient was not finite (nothing saved).
      CheckpointError: `resume` found checkpoints it cannot use.
    """
    voice = voice or Voice(stream, verbose=verbose)
    # Work that talks to other tasks runs under the watchdog's deadline.
    guard = watchdog.guard if watchdog else unguarded
    signature = run_signature(placement, options)
    if options.checkpoints.resume:
        # Before anything is built: checkpoints of another run are refused
        # as such, not tried one by one as if they were damaged.
        saved = saved_signature(options.checkpoints.directory)
        if saved is not None:
            check_signature(*saved, signature)
    if built is None:
        built = guard(
            "building the towers", build,
            placement, options.data, options.model, options.reducer, info.val_size,
        )
    if built.learning_rates is not None:
        loop_options = options.loop
        built.learning_rates.set_lengths(loop_options.steps_per_epoch,
                                         loop_options.epochs * loop_options.steps_per_epoch)
    voice.header(describe(placement, options, built.step.model, info, built.step.reducer))
    run_watchers = [NonFiniteGuard(placement.devices, skip=options.skip_nonfinite,
                                   warn=voice.warn)]
    saver = None
    if options.checkpoints.directory:
        saver = _checkpoints(placement, options, built, signature, voice, guard)
        run_watchers.append(saver)
        if options.checkpoints.keep_best:
            run_watchers.append(BestCheckpoint(
                saver.checkpoints.checkpoint, options.checkpoints.directory,
                options.checkpoints.keep_best, voice.say, saver.checkpoints.io, guard,
                resume=options.checkpoints.resume))
    summaries = None
    if options.logdir:
        # Made after the restore (it drops the scalars past the restored
        # step), watching before the saver: an epoch's events are flushed
        # before its checkpoint, so a run killed after that checkpoint has
        # them all.
        try:
            summaries = Summaries(
                options.logdir, options.profile_steps, int(built.step.global_step.numpy()),
                options.loop.steps_per_loop,
            )
        except tf.errors.OpError as err:
            raise _output_failure(err, options, saver) or err from None
        run_watchers.insert(1, summaries)
    if stop is not None:
        run_watchers.append(SignalWatcher(stop, options.loop))
    log = _placement_log(placement, options, built)
    call = log.call if log is not None else loop.plain_call
    if watchdog is not None:
        call = watchdog.wrap_call(call)
    try:
        # The held-out pass completes each epoch's record; the metrics file
        # writes it before anything else hears of it.
        evaluation = ([loop.Evaluation(built.step, built.held_out, options.loop.eval_steps, call)]
                      if built.held_out is not None and options.loop.eval_steps else [])
        history = loop.run(built.step, built.train_iterators, options.loop,
                           EpochProgress(stream, verbose=verbose), call,
                           [*evaluation, MetricsFile(options.loop.metrics_path), *run_watchers,
                            *watchers],
                           halt_on_nonfinite=not options.skip_nonfinite)
    except StopRequested as stopped:
        stopped.checkpoint = saver.save(stopped.step) if saver else None
        raise
    except NonFiniteError as err:
        err.checkpoint = saver.checkpoints.latest if saver else None
        raise
    except (OSError, tf.errors.OpError) as err:
        failure = _output_failure(err, options, saver)
        if failure is None:
            raise
        raise failure from None
    finally:
        if summaries:
            try:
                summaries.close()
            except tf.errors.OpError:
                pass  # a full disk, said above; the events written so far stay
    if options.placement.log_path:
        _report_placement(log, options, voice, placement_summary)
    return history


def _output_failure(err: Exception, options: TrainOptions,
                    saver: CheckpointWatcher | None) -> OutputError | None:
    """The one line for a metrics file or TensorBoard event file that could
    not be written mid-run, or None when `err` is about neither."""
    kept = saver.checkpoints.latest if saver else None
    metrics = options.loop.metrics_path
    if isinstance(err, OSError) and metrics and err.filename == metrics:
        return outputs.write_failure("metrics", metrics, err, what="the epoch's line",
                                     kept=kept, checkpoints=saver is not None)
    logdir = options.logdir
    if isinstance(err, tf.errors.OpError) and logdir and logdir in str(err.message):
        return outputs.write_failure("logdir", logdir, err, what="the TensorBoard event file",
                                     kept=kept, checkpoints=saver is not None)
    return None


def _checkpoints(placement: Placement, options: TrainOptions, built: BuiltRun, signature: str,
                 voice: Voice, guard) -> CheckpointWatcher:
    """The run's checkpoints: room for one checked, the newest restored when
    resuming (refused if another run wrote it), and the watcher that saves."""
    size = state_bytes(built.step.trackables())
    outputs.check_room("checkpoint_dir", options.checkpoints.directory, size)
    run = tf.Variable(signature, trainable=False)
    state = {**built.step.trackables(), "run": run,
             "train_data": saveable_iterators(placement.towers, built.train_iterators)}
    if built.held_out is not None:
        state["held_out"] = [
            *saveable_iterators(placement.towers, built.held_out.iterators),
            built.held_out.position,
        ]
    checkpoints = Checkpoints(options.checkpoints, state, warn=voice.warn, size=size)
    if options.checkpoints.resume:
        path = guard("restoring a checkpoint", checkpoints.restore)
        if path:
            check_signature(path, run.numpy().decode(), signature)
            voice.say(f"resumed from {path} at step {int(built.step.global_step.numpy())}"
                      + replay_gpu_readers(placement, built, voice.say, guard))
        else:
            voice.say(f"<resume>: no checkpoint in {options.checkpoints.directory} yet; "
                      "starting from the beginning")
    return CheckpointWatcher(checkpoints, options.loop.steps_per_epoch, voice.say, guard)


def _placement_log(placement: Placement, options: TrainOptions,
                   built: BuiltRun) -> PlacementLog | None:
    """The placement log that captures the first train and eval steps, or
    None when nothing is to be captured."""
    if not options.placement.capture:
        return None
    return PlacementLog(
        options.placement.log_path,
        run_info(placement, options, built.step.model, built.step.reducer),
        strict=options.placement.strict,
        timings=options.placement.timings and options.placement.log_path is not None,
        max_transfer_bytes=options.placement.max_transfer_bytes,
    )


def _report_placement(log: PlacementLog, options: TrainOptions, voice: Voice,
                      summary: bool) -> None:
    """What the placement log says at the end: its summary when asked, its
    notes, where it is, and where TensorBoard finds it."""
    if summary:
        voice.say(placement_summary_lib.summary(log.entries))
        voice.say("placement log: why ops moved, peak memory and the step's critical path: "
                  + voice.full_summary(options.placement.log_path))
    for note in log.notes:
        voice.say(f"placement log: {note}")
    voice.say(f"placement log: {options.placement.log_path}")
    if options.logdir:
        from engine.placement import tensorboard

        written = tensorboard.write(options.logdir, log.metadata, log.entries)
        voice.say(f"placement in TensorBoard: {written} (Graphs, tag placement/train; "
                  "Color: Device or Compute time)")


def state_bytes(trackables: dict) -> int:
    """The bytes of every variable a checkpoint of `trackables` holds (an
    optimizer's slots included)."""
    seen, total = set(), 0
    for value in tf.nest.flatten(list(trackables.values())):
        variables = getattr(value, "variables", None)
        for variable in (variables if isinstance(variables, list) else [value]):
            if isinstance(variable, tf.Variable) and id(variable) not in seen:
                seen.add(id(variable))
                total += int(variable.shape.num_elements() or 0) * variable.dtype.size
    return total
