"""Loading the user's own functions: `--model` and `--reducer` as module:function."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable


def load_function(spec: str, flag: str, error: type[Exception]) -> Callable:
    """Imports `package.module:function`, from the working directory too (as
    `python -m` would), and raises `error` naming `flag` when it cannot."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if not module_name or not attr:
        raise error(f"{flag} {spec!r} is not package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the user's module may fail in any way on import
        raise error(f"{flag} {spec!r}: cannot import {module_name!r} ({err})")
    function = getattr(module, attr, None)
    if not callable(function):
        raise error(f"{flag} {spec!r}: {module_name} has no function {attr!r}")
    return function
