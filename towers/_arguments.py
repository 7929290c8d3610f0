"""Python arguments of the wrong type, refused in one line before anything
runs: the argument, the value and its type, and what the signature accepts.

The accepted types are read from the function's own annotations, so a new
argument is checked as soon as it is typed. Annotations of types this module
does not know (a `Source`, a Keras schedule) are left to the argument's own
checks, which give their own one-line errors.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable

from engine.errors import UsageError

# Annotation name -> (test of a value, how a message says it).
_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "int": (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "an int"),
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "str": (lambda v: isinstance(v, str), "a str"),
    "None": (lambda v: v is None, "None"),
    "Sequence": (lambda v: isinstance(v, (list, tuple)), "a list or tuple"),
    "tuple": (lambda v: isinstance(v, (list, tuple)), "a tuple"),
    "Callable": (callable, "a function"),
    # Types of this package and Keras', told by class name, so that nothing
    # here imports TensorFlow.
    "sources.Source": (lambda v: _is_a(v, "Source"), "a towers.data source"),
    "Topology": (lambda v: _is_a(v, "Topology"), "a towers.cost.Topology"),
    "LearningRateSchedule": (lambda v: _is_a(v, "LearningRateSchedule"),
                             "a keras.optimizers.schedules.LearningRateSchedule"),
    "keras.losses.Loss": (lambda v: _is_a(v, "Loss"), "a keras.losses.Loss"),
    "TextIO": (lambda v: callable(getattr(v, "write", None)), "a text stream"),
}


def _is_a(value, name: str) -> bool:
    """True when `value`'s class or one it derives from is named `name`."""
    return any(cls.__name__ == name for cls in type(value).__mro__)


def _parts(annotation: str) -> list[str]:
    """The members of a union, at the top level only (`Sequence[str | int]`
    is one member)."""
    parts, depth, start = [], 0, 0
    for k, char in enumerate(annotation):
        depth += char == "["
        depth -= char == "]"
        if char == "|" and depth == 0:
            parts.append(annotation[start:k].strip())
            start = k + 1
    return [*parts, annotation[start:].strip()]


def accepted(annotation) -> list[tuple[Callable[[object], bool], str]] | None:
    """The tests an annotation (a string, as `from __future__ import
    annotations` keeps it) stands for; None when one of its members is a type
    this module does not check."""
    if not isinstance(annotation, str):
        return None
    kinds = []
    for part in _parts(annotation):
        kind = _KINDS.get(part.split("[", 1)[0].strip())
        if kind is None:
            return None
        kinds.append(kind)
    return kinds


def check(function: Callable, arguments: dict) -> None:
    """Refuses an argument whose value none of its annotation's types take.

    Args:
      function: the function whose signature types the arguments.
      arguments: name -> value, as the call received them.

    Raises:
      UsageError: `<name> value is a T; give ...`, with the value without
        quotes where a str was given for a number.
    """
    for name, parameter in inspect.signature(function).parameters.items():
        if name not in arguments:
            continue
        kinds = accepted(parameter.annotation)
        value = arguments[name]
        if kinds is None or any(test(value) for test, _ in kinds):
            continue
        wanted = ", or ".join(dict.fromkeys(said for _, said in kinds))
        hint = ""
        if isinstance(value, str) and any(said in ("an int", "a number") for _, said in kinds):
            try:
                hint = f" (without quotes: {name}={float(value):g})"
            except ValueError:
                pass
        kind = type(value).__name__
        article = "an" if kind[0].lower() in "aeiou" else "a"
        raise UsageError(f"<{name}> {shown(value)} is {article} {kind}; give {wanted}{hint}")


def shown(value) -> str:
    """A value as a message shows it: its repr where that is its value (a
    str, a number, a list), else its type (no memory address)."""
    if value is None or isinstance(value, (str, numbers.Number, list, tuple, dict)):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    return f"<a {type(value).__name__} object>"
