"""Mixed precision: which compute dtype the towers use, and building under it.

With mixed precision, layers compute in bfloat16 on CPU towers (no loss
scaling needed: bfloat16 has float32's exponent range) and in float16 on GPU
towers (which need loss scaling, engine/core/loss_scale.py), unless bfloat16
is named for GPU towers too. Variables stay float32 either way, and the step
computes the loss in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras

from engine.core.options import COMPUTE_DTYPES
from engine.errors import UsageError
from engine.topology.devices import Placement

_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


MIXED = ("float16", "bfloat16")


def mixed_dtype(placement: Placement, requested: bool | str = True) -> str:
    """The compute dtype mixed precision means for these towers.

    Args:
      placement: the towers.
      requested: True for each kind's usual dtype (float16 on GPU towers,
        bfloat16 on CPU towers), or `"float16"` or `"bfloat16"` by name.
        GPUs take both; CPUs compute bfloat16 only.

    Raises:
      UsageError: an unknown dtype, float16 on CPU towers, or towers that
        mix CPUs and GPUs when the dtype is left to the towers.
    """
    kinds = {"GPU" if t.gpu_index is not None else "CPU" for t in placement.towers}
    if requested is not True:
        if requested not in MIXED:
            raise UsageError(
                f"<mixed_precision={requested}> is not one of True, {', '.join(MIXED)}"
            )
        if requested == "float16" and "CPU" in kinds:
            raise UsageError(
                f"<mixed_precision=float16> <devices={','.join(placement.devices)}>: CPU "
                "towers have no fast float16 arithmetic; use <mixed_precision=bfloat16>"
            )
        return requested
    if kinds == {"GPU"}:
        return "float16"
    if kinds == {"CPU"}:
        return "bfloat16"
    raise UsageError(
        f"<mixed_precision=True> <devices={','.join(placement.devices)}>: CPU towers compute "
        "in bfloat16 and GPU towers in float16, but every tower runs the same model; "
        "use only GPU or only CPU towers, name <mixed_precision=bfloat16>, or drop "
        "<mixed_precision>"
    )


def needs_loss_scaling(compute_dtype: str) -> bool:
    """float16's range is narrow enough for small gradients to flush to zero."""
    return compute_dtype == "float16"


@contextlib.contextmanager
def policy(compute_dtype: str) -> Iterator[None]:
    """Keras' global dtype policy set for `compute_dtype` while models are built."""
    if compute_dtype not in _POLICIES:
        raise UsageError(
            f"<compute_dtype> {compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}"
        )
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(_POLICIES[compute_dtype])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
