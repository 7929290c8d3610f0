"""The non-finite guard: stop (or skip and count) when a loss or gradient is not finite.

The step itself never applies a non-finite update (engine/core/step.py); this
watcher decides what the run does about it. A step the dynamic loss scale
overflowed (`overflow` in the step's outputs) has already been handled by
lowering the scale: it passes silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.errors import RunError


class NonFiniteError(RunError):
    """A step's loss or gradient was not finite; the message is one line."""


class NonFiniteGuard:
    """Raises NonFiniteError naming the step and towers, or with `skip`
    reports the skipped step and lets the run go on."""

    def __init__(self, devices: Sequence[str], *, skip: bool, warn: Callable[[str], None]):
        self.devices = list(devices)
        self.skip = skip
        self.warn = warn

    def after_step(self, step: int, outputs: dict) -> None:
        finite = np.asarray(outputs["finite"])
        if finite.all() or bool(outputs["overflow"]):
            return
        towers = ", ".join(
            f"tower {k} ({self.devices[k]})" for k, ok in enumerate(finite) if not ok
        )
        message = f"step {step}: the loss or a gradient of {towers} is not finite"
        if not self.skip:
            raise NonFiniteError(message + "; the update was not applied")
        self.warn(f"{message}; update skipped (<skip_nonfinite=True>)")

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        pass
