"""Progress lines a Keras user recognises, and the per-epoch metrics file."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import TextIO

# A step's outputs that are flags, not figures: the rest (loss, accuracy,
# learning_rate, ...) go to TensorBoard and callbacks as they are.
STEP_FLAGS = ("finite", "overflow", "block_end")

# The figures a record reports for its data, trained on (`loss`) or held out
# (`eval_loss`): the loss, the accuracy and a top-k accuracy.
_FIGURE = re.compile(r"loss|accuracy|top\d+_accuracy")


def figures(values: dict, prefix: str = "") -> dict:
    """The figures in `values` (a record, or the step's metrics) named with
    `prefix` (`eval_` for the held-out set's), in their order."""
    return {key: value for key, value in values.items()
            if key.startswith(prefix) and _FIGURE.fullmatch(key[len(prefix):])}


def is_figure(name: str) -> bool:
    """True for a figure of a record, trained on or held out (`eval_loss`)."""
    return bool(_FIGURE.fullmatch(name.removeprefix("eval_")))


def record_name(name: str) -> str:
    """The record's name for a figure named as Keras does (`val_loss` is
    `eval_loss` here); other names as they are."""
    return re.sub(r"^val_", "eval_", name)


def format_metrics(values: dict[str, float]) -> str:
    """` - loss: 0.1234 - accuracy: 0.9650 - images/s: 12345`, None values skipped."""
    parts = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, int):  # counts
            parts.append(f"{key}: {value:,}")
        elif key.endswith("/s"):  # images/s, sequences/s
            parts.append(f"{key}: {value:.0f}")
        else:
            parts.append(f"{key}: {value:.4f}")
    return "".join(f" - {p}" for p in parts)


def bar(done: int, total: int, width: int = 20) -> str:
    filled = width * done // max(total, 1)
    return "━" * filled + "─" * (width - filled)


class EpochProgress:
    """Prints `Epoch k/n`, a live step line while it runs, and the final line.

    On a terminal the step line is rewritten in place every `interval` seconds;
    elsewhere (pipes, CI logs) a line is printed every `interval` seconds, so
    long epochs still show they are moving.
    """

    def __init__(self, stream: TextIO = sys.stdout, interval: float | None = None,
                 verbose: int = 1):
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval if interval is not None else (0.5 if self.tty else 15.0)
        self.verbose = verbose  # as Keras: 0 silent, 1 live lines, 2 a line per epoch
        self._last = 0.0

    def start(self, epoch: int, epochs: int) -> None:
        if self.verbose:
            print(f"Epoch {epoch}/{epochs}", file=self.stream, flush=True)
        self._last = time.monotonic()

    def due(self) -> bool:
        """True when it is time for a live line; cheap enough to ask every step."""
        return self.verbose == 1 and time.monotonic() - self._last >= self.interval

    def update(self, step: int, steps: int, values: dict[str, float]) -> None:
        self._last = time.monotonic()
        line = f"{step}/{steps} {bar(step, steps)}{format_metrics(values)}"
        if self.tty:
            print("\r" + line + "\x1b[K", end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)

    def end(self, steps: int, seconds: float, values: dict[str, float]) -> None:
        if not self.verbose:
            return
        per_step = 1000.0 * seconds / max(steps, 1)
        if self.verbose == 2:
            print(f"{steps}/{steps} - {seconds:.0f}s - {per_step:.0f}ms/step"
                  + format_metrics(values), file=self.stream, flush=True)
            return
        line = (
            f"{steps}/{steps} {bar(steps, steps)} {seconds:.0f}s {per_step:.0f}ms/step"
            + format_metrics(values)
        )
        prefix = "\r" if self.tty else ""
        suffix = "\x1b[K" if self.tty else ""
        print(prefix + line + suffix, file=self.stream, flush=True)


class MetricsFile:
    """Appends one JSON object per epoch to a file, flushed line by line.

    Appending means a second run never erases a first run's lines, and a run
    that dies keeps every epoch it finished.
    """

    def __init__(self, path: str | None):
        self.path = path

    # As a watcher of the loop (engine.core.loop.Watcher): a resumed run
    # writes the epoch it resumes in, and any after, anew; every epoch's
    # record is a line.
    def before_first_step(self, step: int, steps_per_epoch: int) -> None:
        if step:
            self.resume_at(step // steps_per_epoch + 1)

    def after_step(self, step: int, outputs: dict) -> None:
        pass

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        self.write(record)

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        try:
            with open(self.path, "a") as stream:
                stream.write(json.dumps(record) + "\n")
        except OSError as err:  # a full disk shows at the close, without the file's name
            raise OSError(err.errno, err.strerror, self.path) from None

    def resume_at(self, epoch: int) -> int:
        """Drops the last lines, those of `epoch` and later, which a run
        resumed in `epoch` writes again (a run killed between an epoch's
        line and its checkpoint wrote one too many); returns how many.
        Only the file's end is looked at: an earlier run's lines before
        them stay. The file is rewritten whole and then renamed, so a crash
        keeps one or the other.
        """
        if self.path is None or not os.path.isfile(self.path):
            return 0
        with open(self.path) as stream:
            lines = stream.read().splitlines(keepends=True)
        kept = list(lines)
        while kept and (_epoch_of(kept[-1]) or 0) >= epoch:
            kept.pop()
        if len(kept) < len(lines):
            with open(self.path + ".tmp", "w") as stream:
                stream.writelines(kept)
            os.replace(self.path + ".tmp", self.path)
        return len(lines) - len(kept)


def _epoch_of(line: str) -> int | None:
    """The `epoch` of a metrics line; None for a line that is not one."""
    try:
        epoch = json.loads(line).get("epoch")
    except (ValueError, AttributeError):
        return None
    return epoch if isinstance(epoch, int) else None


class Voice:
    """How a run speaks to its user: plain lines, its header, and warnings,
    each with its argument markers rendered (engine.errors) and held back
    below `verbose` 1 (warnings never are).

    A command line subclasses it to name itself and its flags.

    Args:
      stream: where every line goes.
      render: renders argument markers; default, in Python terms.
      verbose: 0 warnings only, 1 or 2 everything (as Keras' `fit`).
    """

    def __init__(self, stream: TextIO = sys.stdout, render=None, verbose: int = 1):
        from engine.errors import render as python_terms

        self.stream = stream
        self.render = render or python_terms
        self.verbose = verbose

    def say(self, text: str) -> None:
        """A line about the run (a checkpoint saved, the placement log written)."""
        if self.verbose:
            print(self.render(text), file=self.stream, flush=True)

    def header(self, text: str) -> None:
        """The run's layout, printed before the first step."""
        self.say(text)

    def warn(self, text: str) -> None:
        """Something the user should know that does not stop the run."""
        print(f"warning: {self.render(text)}", file=self.stream, flush=True)

    def full_summary(self, log_path: str) -> str:
        """How to print a placement log's full summary, in this voice's terms."""
        return f"towers.placement.summary(towers.placement.load({log_path!r}), full=True)"
