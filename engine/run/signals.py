"""SIGINT and SIGTERM: finish the step, save, and stop; a second Ctrl-C stops at once."""

from __future__ import annotations

import os
import signal
import sys


class StopRequested(Exception):
    """The loop stopped after a step because a signal asked it to."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"{signal.Signals(signum).name} after step {step}")
        self.signum = signum
        self.step = step

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM


class GracefulStop:
    """Installs the handlers for the length of a `with` block.

    The first SIGINT or SIGTERM only records itself; the loop asks `requested`
    after each step. A second SIGINT exits at once with 130.
    """

    def __init__(self, say=None):
        """`say(line)` tells the user a signal came in (default: on stderr, in
        Python terms)."""
        if say is None:
            def say(message: str) -> None:
                from engine.errors import render

                print(render(message), file=sys.stderr, flush=True)

        self.say = say
        self.requested: int | None = None
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested is not None and signum == signal.SIGINT:
            self.say("second interrupt, exiting now without saving")
            os._exit(130)
        if self.requested is None:
            self.requested = signum
            self.say(
                f"{signal.Signals(signum).name} received; finishing this step (or loop of "
                "<steps_per_loop> steps; Ctrl-C again to quit at once)"
            )

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return False

    def check(self, step: int) -> None:
        """Raises StopRequested if a signal came in."""
        if self.requested is not None:
            raise StopRequested(self.requested, step)
