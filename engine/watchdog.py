"""A deadline on work that may wait without end: a step whose worker stalled.

TensorFlow reports a worker that is gone (its port refuses) at once, but waits
without limit for one that stopped answering (a frozen process, a host cut
off). The watchdog is a thread that wakes once a second; when the work it
guards runs past its deadline it calls `on_overrun`, which reports and ends
the process: the training thread is inside TensorFlow and cannot be
interrupted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Watchdog:
    """Calls `on_overrun(what, seconds)` when guarded work runs `timeout` s.

    Args:
      timeout: seconds any one piece of guarded work may take.
      on_overrun: called from the watchdog thread with a description of the
        work and the seconds it has run; expected not to return (it ends the
        process), and the watchdog stops if it does.
    """

    def __init__(self, timeout: float, on_overrun: Callable[[str, float], None]):
        self.timeout = timeout
        self.on_overrun = on_overrun
        self._lock = threading.Lock()
        self._what: str | None = None
        self._started = 0.0
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._thread.start()

    def guard(self, what: str, function: Callable, *args):
        """Runs `function(*args)` under the deadline."""
        with self._lock:
            self._what, self._started = what, time.monotonic()
        try:
            return function(*args)
        finally:
            with self._lock:
                self._what = None

    def wrap_call(self, call: Callable) -> Callable:
        """A loop `call(kind, function, *args)` with every call guarded."""

        def guarded(kind: str, function: Callable, *args):
            return self.guard(f"a {kind} step", call, kind, function, *args)

        return guarded

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            with self._lock:
                what, started = self._what, self._started
            if what is not None and time.monotonic() - started > self.timeout:
                self.on_overrun(what, time.monotonic() - started)
                return
