"""The engine's errors: one base class, and messages in the caller's own terms.

Every error the engine raises on purpose is a `TowerError`, with a one-line
message that names the argument, the value and the fix. The library speaks
Python and the command line speaks flags, so a message names its arguments
with markers that each side renders in its own terms:

* `<name>`: the argument, e.g. `<learning_rate>` is `learning_rate` in Python
  and the command line's own flag for it there;
* `<name=value>`: the argument with a value, e.g. `<variables=replicated>` is
  `variables='replicated'` in Python and the flag with its value on the
  command line; `<xla=True>` is `xla=True` and the bare flag.

`str(error)` is the Python rendering; `error.render(flags)` the one for a
command line whose flags map argument names to flags. Only the names in
`ARGUMENTS` and the fields of declared options classes (`declare`) are
markers, so that text such as `<lambda>` stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["ARGUMENTS", "RunError", "TowerError", "UsageError", "declare", "is_argument",
           "render"]

# The arguments of towers.Trainer, its fit, the data sources and the tools
# that no options class declares (`declare`).
ARGUMENTS = frozenset("""
    augment batch_size best callbacks check check_reducer checkpoint_dir checkpoint_every
    cluster compress connect_timeout dali_threads data deterministic devices fit_links
    format gpu_memory group_size growth_interval image_shape image_size init_weights initial
    json keep_best keep_checkpoints log_device_placement logdir lr_schedule max_bytes
    max_peak_memory max_total_bytes max_transfer_bytes metrics minimum mixed_precision
    num_classes out pack_bytes path pipeline placement_log placement_summary port prefetch
    profile_steps reduce_device reducer reducers resume samples save_model seeds seq_len
    sizes skip_nonfinite source step_timeout steps stream strict_placement target_accuracy
    topologies topology verbose warmup_epochs
""".split())
_declared: set[str] = set()


def declare(options_class) -> None:
    """Makes the fields of a frozen options dataclass markers: an option
    declared there is rendered in messages with nothing else to keep
    (engine.core.options declares its classes as it defines them)."""
    import dataclasses

    _declared.update(f.name for f in dataclasses.fields(options_class) if f.init)


def is_argument(name: str) -> bool:
    """Whether `<name>` in a message is a marker (ARGUMENTS, or a declared field)."""
    return name in ARGUMENTS or name in _declared


_MARKER = re.compile(r"<([a-z_][a-z0-9_]*)(?:=([^<>]*))?>")


def _python_value(value: str) -> str:
    if value in ("True", "False", "None"):
        return value
    try:
        float(value)
    except ValueError:
        return repr(value)
    return value


def render(message: str, flags: Mapping[str, str] | None = None) -> str:
    """`message` with its argument markers in Python terms, or as `flags`.

    Args:
      message: text with `<name>` and `<name=value>` markers.
      flags: argument name -> the command line's flag for it, and
        `name=value` -> a flag that says both (a negative flag for `xla=False`);
        None renders Python terms. Names missing from `flags` stay in
        Python terms.

    Returns:
      The message with every marker replaced.
    """

    def one(match: re.Match) -> str:
        name, value = match.group(1), match.group(2)
        if not is_argument(name):
            return match.group(0)
        flags_ = flags or {}
        if value is not None and f"{name}={value}" in flags_:
            return flags_[f"{name}={value}"]  # a flag of its own, as a negative one
        flag = flags_.get(name)
        if flag is None:
            return name if value is None else f"{name}={_python_value(value)}"
        if value is None or value == "True":
            return flag
        return f"{flag} {value}"

    return _MARKER.sub(one, message)


class TowerError(Exception):
    """Base of every error the engine raises on purpose; one line, with
    argument markers (module docstring).

    Args:
      message: the line, with `<name>` markers for the arguments it names.
    """

    # Raised while a tf.function is traced, an error keeps its type and its
    # one line: autograph re-raises it as it is instead of adding its frames.
    ag_pass_through = True

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return render(self.message)

    def render(self, flags: Mapping[str, str] | None = None) -> str:
        """The message with its arguments named as `flags` has them.

        Args:
          flags: argument name -> how to name it (`learning_rate` -> `--lr`);
            None: in Python terms (`render`).
        """
        return render(self.message, flags)


class UsageError(TowerError, ValueError):
    """Bad input: an argument, a file or a function the caller gave."""


class RunError(TowerError, RuntimeError):
    """A run that started and could not go on."""
