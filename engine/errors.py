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
`ARGUMENTS` are markers, so that text such as `<lambda>` stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["ARGUMENTS", "RunError", "TowerError", "UsageError", "render"]

# The arguments of towers.Trainer, its fit, the data sources and the tools.
ARGUMENTS = frozenset("""
    batch_size check check_reducer check_replicas checkpoint_dir checkpoint_every cluster compress
    compute_dtype connect_timeout dali_threads data deterministic devices epochs eval_steps
    fit_links from_logits json save_model verbose callbacks
    augment format gpu_memory group_size growth_interval image_shape image_size initial
    keep_checkpoints learning_rate lr_schedule warmup_epochs clip_norm label_smoothing
    weight_decay metrics_top_k accumulate init_weights keep_best
    logdir loss max_bytes max_peak_memory max_total_bytes max_transfer_bytes metrics minimum
    mixed_precision model num_classes optimizer pack_bytes path pipeline
    placement_log port prefetch profile_steps reduce_device reducer reducers resume samples seed
    seeds seq_len sizes out target_accuracy topologies
    skip_nonfinite source step_timeout steps_per_epoch steps_per_loop strict_placement
    topology variables xla best log_device_placement placement_summary steps stream
""".split())

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
        if name not in ARGUMENTS:
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
