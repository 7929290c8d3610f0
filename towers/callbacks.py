"""Callbacks: your code after every step and epoch, as in Keras' `fit(callbacks=...)`.

A callback is an object with any of `on_train_begin(logs)`,
`on_train_batch_end(batch, logs)`, `on_epoch_end(epoch, logs)` and
`on_train_end(logs)`; `Callback` gives all four as no-ops to override.
`fit` sets `callback.trainer` to the Trainer before the first, and a
callback stops the run after the current epoch by setting
`self.trainer.stop_training = True` (Keras: `self.model.stop_training`).

`logs` is the epoch's record, the one `fit` returns: `loss`, `accuracy`,
`eval_loss`, `eval_accuracy`, `images_per_sec`, `seconds`, ... Keras calls the
held-out figures `val_loss` and `val_accuracy`; they are here too, under
those names, so that a Keras habit (`monitor="val_loss"`) works.

Example:

    import towers

    class PrintAccuracy(towers.callbacks.Callback):
        def on_epoch_end(self, epoch, logs):
            print(f"epoch {epoch}: held-out accuracy {logs['val_accuracy']:.4f}")

    trainer = towers.Trainer("cpu:2")
    trainer.fit(epochs=20, callbacks=[PrintAccuracy(),
                                      towers.callbacks.EarlyStopping(patience=2)])
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from engine.core.progress import STEP_FLAGS, figures, record_name
from engine.errors import UsageError

__all__ = ["Callback", "EarlyStopping"]



class Callback:
    """A callback that does nothing; subclass it and override what you need.

    Attributes:
      trainer: the `towers.Trainer` whose `fit` calls it (set by `fit`).
    """

    trainer = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Called once, before the first epoch of a `fit`.

        Args:
          logs: None (Keras' signature).
        """

    def on_train_batch_end(self, batch: int, logs: dict) -> None:
        """Called after every training step, in order, whatever
        `steps_per_loop` is: the steps of a loop are reported once it has
        returned, each with its own figures.

        Args:
          batch: the step's index in its epoch, counted from 0 (as Keras).
          logs: `loss` and `accuracy` of this step alone (Keras gives the
            epoch's running means; the epoch's are in `on_epoch_end`), the
            `learning_rate` its update used, `grad_norm` (the reduced
            gradients' norm before clipping, with `clip_norm`), the top-k
            accuracy (`top5_accuracy`, with `metrics_top_k`), and `step`,
            the global step counted from 1.
        """

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        """Called after every epoch, its evaluation and its checkpoint.

        Args:
          epoch: the epoch's index, counted from 0 (as Keras does; the
            record's own `epoch` counts from 1, as the progress lines do).
          logs: the epoch's record, with `val_loss` and `val_accuracy` too.
        """

    def on_train_end(self, logs: dict | None = None) -> None:
        """Called once, after the last epoch (or the one that stopped the run).

        Args:
          logs: the last epoch's record (None when no epoch ran).
        """


class EarlyStopping(Callback):
    """Stops training when a figure has not improved for `patience` epochs.

    Args:
      monitor: the record's figure to watch: `eval_loss` (default; Keras'
        `val_loss` too), `eval_accuracy`, `loss`, `accuracy`.
      min_delta: a change smaller than this is no improvement.
      patience: epochs without improvement before stopping.
      mode: `min`, `max`, or `auto` (max for accuracies, min for the rest).

    Raises:
      UsageError: a mode or patience out of range.

    Attributes:
      stopped_epoch: the epoch (from 0) after which it stopped the run, or None.
      best: the best value seen.
    """

    def __init__(self, monitor: str = "eval_loss", min_delta: float = 0.0, patience: int = 0,
                 mode: str = "auto"):
        if mode not in ("auto", "min", "max"):
            raise UsageError(f"EarlyStopping: mode {mode!r} is not one of auto, min, max")
        if patience < 0:
            raise UsageError(f"EarlyStopping: patience ({patience}) must be 0 or more")
        self.monitor = record_name(monitor)
        self.min_delta = abs(min_delta)
        self.patience = patience
        self.sign = (1.0 if mode == "max" or (mode == "auto" and "accuracy" in self.monitor)
                     else -1.0)  # +1: larger is better
        self.best = None
        self.wait = 0
        self.stopped_epoch = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.best, self.wait, self.stopped_epoch = None, 0, None

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if self.monitor not in logs:
            raise UsageError(
                f"EarlyStopping: monitor {self.monitor!r} is not in the epoch's record; "
                f"it has {', '.join(sorted(logs))}"
            )
        value = logs[self.monitor]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return  # no figure this epoch (no held-out set, every step skipped)
        if self.best is None or self.sign * (value - self.best) > self.min_delta:
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait > self.patience:
            self.stopped_epoch = epoch
            self.trainer.stop_training = True


class _Watcher:
    """The callbacks as one of the loop's watchers (engine.core.loop.Watcher)."""

    def __init__(self, callbacks: list, trainer, steps_per_epoch: int):
        self.callbacks = callbacks
        self.trainer = trainer
        self.steps_per_epoch = steps_per_epoch
        # Only callbacks that do something per step cost a call per step.
        self.per_step = [c for c in callbacks if getattr(type(c), "on_train_batch_end", None)
                         not in (None, Callback.on_train_batch_end)]

    def begin(self) -> None:
        for callback in self.callbacks:
            callback.trainer = self.trainer
            _call(callback, "on_train_begin", None)

    def after_step(self, step: int, outputs: dict) -> None:
        if not self.per_step:
            return
        logs = {key: value for key, value in outputs.items() if key not in STEP_FLAGS}
        logs["step"] = step
        for callback in self.per_step:
            _call(callback, "on_train_batch_end", (step - 1) % self.steps_per_epoch, logs)

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        # Keras' names of the held-out figures too: val_loss, val_accuracy, ...
        logs = {**record, **{f"val_{key.removeprefix('eval_')}": value
                             for key, value in figures(record, "eval_").items()}}
        for callback in self.callbacks:
            _call(callback, "on_epoch_end", epoch - 1, logs)

    @property
    def stop_training(self) -> bool:
        return bool(self.trainer.stop_training)

    def end(self, history: list[dict]) -> None:
        for callback in self.callbacks:
            _call(callback, "on_train_end", history[-1] if history else None)


def _call(callback, method: str, *args) -> None:
    from engine.userfn import calling, label

    function = getattr(callback, method, None)
    if function is None:
        return
    with calling("callbacks", label(type(callback))):
        function(*args)


def watcher(callbacks: Iterable, trainer, steps_per_epoch: int) -> _Watcher:
    """The loop's watcher that calls `callbacks` for `trainer`'s fit of
    `steps_per_epoch` steps an epoch.

    Raises:
      UsageError: something that is not a callback.
    """
    callbacks = list(callbacks or ())
    for callback in callbacks:
        if not any(hasattr(callback, m) for m in ("on_train_begin", "on_train_batch_end",
                                                  "on_epoch_end", "on_train_end")):
            raise UsageError(
                f"<callbacks>: {callback!r} has none of on_train_begin, on_train_batch_end, "
                "on_epoch_end, on_train_end; subclass towers.callbacks.Callback"
            )
    return _Watcher(callbacks, trainer, steps_per_epoch)
