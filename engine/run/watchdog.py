"""A deadline on work that may wait without end: a step whose worker stalled.

TensorFlow reports a worker that is gone (its port refuses) at once, but waits
without limit for one that stopped answering (a frozen process, a host cut
off). The watchdog is a thread that wakes four times a second; when the work it
guards runs past its deadline it calls `on_overrun` to report, then ends the
process: the training thread is inside TensorFlow and cannot be interrupted.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

REPORT_SECONDS = 30.0


class Watchdog:
    """Calls `on_overrun(what, seconds)` when guarded work runs `timeout` s.

    Args:
      timeout: seconds any one piece of guarded work may take.
      on_overrun: called from the watchdog thread with a description of the
        work and the seconds it has run, to report; the process then ends
        with exit code 1.
      label: added to the description of work under the default timeout
        (the flag that set it, say).
    """

    def __init__(
        self, timeout: float, on_overrun: Callable[[str, float], None], label: str = ""
    ):
        self.timeout = timeout
        self.label = label
        self.on_overrun = on_overrun
        self._lock = threading.Lock()
        self._what: str | None = None
        self._limit = timeout
        self._started = 0.0
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._thread.start()

    def guard(self, what: str, function: Callable, *args, timeout: float | None = None):
        """Runs `function(*args)` within `timeout` seconds (default: the
        watchdog's); a nested guard gives the outer one back, restarted."""
        if timeout is None and self.label:
            what = f"{what} ({self.label})"
        with self._lock:
            outer = self._what, self._limit
            self._what, self._limit = what, timeout or self.timeout
            self._started = time.monotonic()
        try:
            return function(*args)
        finally:
            with self._lock:
                (self._what, self._limit), self._started = outer, time.monotonic()

    def wrap_call(self, call: Callable) -> Callable:
        """A loop `call(kind, function, *args)` with every call guarded."""

        def guarded(kind: str, function: Callable, *args):
            return self.guard(f"a {kind} step", call, kind, function, *args)

        return guarded

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            with self._lock:
                what, started, limit = self._what, self._started, self._limit
            if what is not None and time.monotonic() - started > limit:
                # The report gets REPORT_SECONDS; then, reported or not, the
                # process ends: the guarded work is stuck inside TensorFlow
                # and nothing else frees it.
                report = threading.Thread(
                    target=self.on_overrun, args=(what, time.monotonic() - started), daemon=True
                )
                report.start()
                report.join(REPORT_SECONDS)
                os._exit(1)
