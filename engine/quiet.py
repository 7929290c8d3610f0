"""Keeping TensorFlow's and absl's C++ logs off the terminal unless asked for.

TensorFlow writes its start-up lines ("All log messages before
absl::InitializeLog() ...", oneDNN and CPU-feature notices, "failed call to
cuInit" on a machine without a GPU) straight to file descriptor 2, some of
them while it is imported, before TF_CPP_MIN_LOG_LEVEL is read. So the
import itself runs with descriptor 2 pointed at /dev/null, and the level
keeps the later ones away. A user who sets TF_CPP_MIN_LOG_LEVEL, or asks for
verbose logs, sees everything.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Iterator

__all__ = ["import_quietly", "quiet_tensorflow", "silenced_fd2"]

LEVEL = "TF_CPP_MIN_LOG_LEVEL"
# The modules whose import prints: TensorFlow, and DALI's plugin that loads it.
NOISY = ("tensorflow", "nvidia.dali.plugin.tf")


@contextlib.contextmanager
def silenced_fd2() -> Iterator[None]:
    """Points file descriptor 2 at /dev/null for the block (C++ writes there
    directly; Python's sys.stderr is flushed first and restored after)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _quiet_wanted() -> bool:
    return os.environ.get(LEVEL) in (None, "3") and "tensorflow" not in sys.modules


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Makes the first import of each NOISY module run with fd 2 silenced,
    whoever imports it (the user's `import keras` as well as the engine)."""

    def find_spec(self, name, path=None, target=None):
        if name not in NOISY:
            return None
        sys.meta_path.remove(self)  # find the real spec without coming back here
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            with silenced_fd2():
                execute(module)

        spec.loader.exec_module = exec_module
        return spec


_FINDER = _QuietFinder()
_ours = {"level": False}  # whether TF_CPP_MIN_LOG_LEVEL was set here, not by the user


def quiet_tensorflow(verbose: bool = False) -> None:
    """From now on, TensorFlow's C++ logs stay off the terminal: its import
    (whoever makes it) runs silenced, and TF_CPP_MIN_LOG_LEVEL is 3 unless
    the user set it. With `verbose`, they are all shown instead (level 0,
    unless the user set one). Once TensorFlow is imported, only what it logs
    later follows the level.
    """
    if LEVEL not in os.environ:
        os.environ[LEVEL] = "3"
        _ours["level"] = True
    if verbose:
        if _ours["level"]:
            os.environ[LEVEL] = "0"
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        return
    if _quiet_wanted() and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def import_quietly() -> None:
    """Imports TensorFlow and DALI's plugin now, quietly unless the user set
    TF_CPP_MIN_LOG_LEVEL to something else than 3."""
    quiet_tensorflow()
    import nvidia.dali.plugin.tf  # noqa: F401
    import tensorflow  # noqa: F401
