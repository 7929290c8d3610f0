"""The user's own functions: loading `package.module:function`, checking a
function's signature against its contract, and naming the function when it
raises.

A model, loss, reducer or pipeline function comes from the user, in Python or
as `package.module:function`. Its mistakes are reported as one line that names
the argument it was given as, the function and what went wrong; the user's own
frames stay on the exception's `__cause__`, for a caller that shows them.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator

from engine.errors import TowerError, UsageError

__all__ = ["UserCodeError", "calling", "check_signature", "label", "load_function",
           "parameters", "spec_arguments"]


class UserCodeError(UsageError):
    """A user's function has the wrong signature, or raised; one line.

    Attributes:
      original: the exception the user's function raised (with its
        traceback), or None for a wrong signature. TensorFlow's tracing can
        drop `__cause__` on the way out; this stays.
    """

    original: BaseException | None = None


def load_function(spec: str, argument: str, error: type[Exception] = UsageError) -> Callable:
    """Imports `package.module:function`, from the working directory too (as
    `python -m` would).

    Args:
      spec: `package.module:function`.
      argument: the argument `spec` was given as, for messages (`model`).
      error: the exception class to raise.

    Returns:
      The function (any callable).

    Raises:
      error: `spec` is malformed, its module cannot be imported, or it has no
        such callable.
    """
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if not module_name or not attr:
        raise error(f"<{argument}> {spec!r} is not package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the user's module may fail in any way on import
        raise error(f"<{argument}> {spec!r}: cannot import {module_name!r} ({err})")
    function = getattr(module, attr, None)
    if not callable(function):
        raise error(f"<{argument}> {spec!r}: {module_name} has no function {attr!r}")
    return function


def label(function: Callable | str) -> str:
    """How messages name a user's function: its spec, or module:qualname."""
    if isinstance(function, str):
        return function
    plain = inspect.isfunction(function) or inspect.ismethod(function)
    target = function if plain else type(function)
    name = getattr(target, "__qualname__", None) or repr(function)
    module = getattr(target, "__module__", None)
    return f"{module}:{name}" if module and module != "builtins" else name


def check_signature(
    function: Callable, argument: str, contract: str, *args, **kwargs
) -> None:
    """Refuses a function that cannot be called as its contract calls it.

    Args:
      function: the user's function or callable object.
      argument: the argument it was given as (`reducer`).
      contract: what the contract asks for, for the message.
      *args, **kwargs: placeholders for the call the engine will make.

    Raises:
      UserCodeError: naming the function, what it takes and the contract.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins have none: let them through
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        raise UserCodeError(
            f"<{argument}> {label(function)!r} takes {parameters(signature)}; {contract}"
        ) from None


def parameters(signature: inspect.Signature) -> str:
    """`(a, b, c)`: a signature's parameter names, for messages."""
    names = [str(p).split(":")[0].split("=")[0] for p in signature.parameters.values()]
    return f"({', '.join(names)})" if names else "no arguments"


@contextlib.contextmanager
def calling(argument: str, function: Callable | str, doing: str = "raised") -> Iterator[None]:
    """Runs the body, which calls the user's `function`; an exception other
    than the engine's own becomes one line naming the function.

    Args:
      argument: the argument the function was given as (`reducer`).
      function: the function, or its label.
      doing: the verb of the message: `<reducer> 'm:f' raised ValueError: ...`.

    Raises:
      UserCodeError: from the exception, which stays as `__cause__`.
    """
    try:
        yield
    except TowerError:
        raise
    except Exception as err:
        error = UserCodeError(
            f"<{argument}> {label(function)!r} {doing} {type(err).__name__}: {last_line(err)}"
        )
        error.original = err
        raise error from err


def last_line(err: BaseException) -> str:
    """The line of an exception's message that says what went wrong: TensorFlow
    and Keras put the cause last, after the frames they add."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def spec_arguments(spec: str, valid: dict, error: type[Exception], argument: str) -> dict:
    """The `k=v` arguments of a built-in's spec (`topk:ratio=0.05`), each
    converted to its default's type.

    Args:
      spec: `name:k=v,...`.
      valid: each parameter's default, by name.
      error: the exception to raise.
      argument: the argument that holds the spec, for messages.

    Raises:
      error: a key that is not a parameter, or a value of the wrong type.
    """
    name, _, given = spec.partition(":")
    listed = ", ".join(f"{k} (default {v})" for k, v in valid.items()) or "none"
    values = {}
    for item in filter(None, given.split(",")):
        key, eq, text = item.partition("=")
        key = key.strip()
        if key not in valid:
            raise error(
                f"<{argument}> {spec!r}: {name} has no parameter {key!r}; its parameters: {listed}"
            )
        kind = type(valid[key])
        try:
            if not eq:
                raise ValueError
            values[key] = _BOOLS[text.strip().lower()] if kind is bool else kind(text.strip())
        except (KeyError, ValueError):
            what = {int: "an integer", bool: "true or false"}.get(kind, "a number")
            example = str(valid[key]).lower() if kind is bool else valid[key]
            raise error(
                f"<{argument}> {spec!r}: {key}={text.strip()!r} is not "
                f"{what}; e.g. {name}:{key}={example}"
            ) from None
    return values

