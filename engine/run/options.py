"""The options of a run around its loop: placement records, checkpoints, and
everything `train` runs with.

Frozen, keyword-only dataclasses; each rule about an argument lives in its
class's `__post_init__`, with an error that names the argument. Nothing here
imports TensorFlow, so a run's arguments are checked before it starts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from engine.core.progress import is_figure, record_name
from engine.errors import UsageError

if TYPE_CHECKING:
    from engine.core.options import LoopOptions, ModelOptions
    from engine.data import DataOptions
    from engine.reducers.options import ReducerOptions

__all__ = ["CheckpointOptions", "PlacementOptions", "TrainOptions"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """Where and how often to save.

    Attributes:
      directory: where checkpoints go, or None for none.
      every: also save every this many steps (0: only at the end of epochs).
      keep: how many of the newest checkpoints to keep.
      resume: continue from the newest good checkpoint in `directory`.
      io_device: the device whose host reads and writes the files; with
        towers on other tasks, this process's CPU, so that the checkpoint
        lands on this machine and not in pieces on every worker.
      keep_best: also keep, in `directory`/best, the checkpoint of the
        epoch with the best value of this figure of the epoch's record
        (`eval_accuracy`, `eval_loss`, `eval_top5_accuracy`, `accuracy`,
        `loss`; Keras' `val_accuracy` and `val_loss` too): the largest
        for an accuracy, the smallest for a loss.
    """

    directory: str | None = None
    every: int = 0
    keep: int = 3
    resume: bool = False
    io_device: str | None = None
    keep_best: str | None = None

    def __post_init__(self):
        if self.every < 0:
            raise UsageError(f"<checkpoint_every> ({self.every}) must be 0 or more")
        if self.keep < 1:
            raise UsageError(f"<keep_checkpoints> ({self.keep}) must be at least 1")
        if self.directory is None and (self.resume or self.every or self.keep_best):
            flag = ("<resume>" if self.resume else "<checkpoint_every>" if self.every
                    else "<keep_best>")
            raise UsageError(f"{flag} needs <checkpoint_dir=DIR>")
        if self.keep_best is not None:
            metric = record_name(self.keep_best)
            if not is_figure(metric):
                raise UsageError(
                    f"<keep_best> {self.keep_best!r} is not a figure of the epoch's "
                    "record: eval_accuracy, eval_loss, eval_top5_accuracy, accuracy or loss "
                    "(Keras' val_ names too)")
            object.__setattr__(self, "keep_best", metric)


@dataclasses.dataclass(frozen=True, kw_only=True)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """Everything the CLI decided, in one place for `train`."""

    data: DataOptions
    model: ModelOptions
    reducer: ReducerOptions
    loop: LoopOptions
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
