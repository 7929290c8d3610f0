"""Mixed precision: which compute dtype the towers use, and building under it.

With `--mixed-precision`, layers compute in bfloat16 on CPU towers (no loss
scaling needed: bfloat16 has float32's exponent range) and in float16 on GPU
towers (which need loss scaling, engine/core/loss_scale.py). Variables stay
float32 either way, and the step computes the loss in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras

from engine.errors import UsageError
from engine.topology.devices import Placement

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def mixed_dtype(placement: Placement) -> str:
    """The compute dtype `--mixed-precision` means for these towers.

    Raises:
      ValueError: the towers mix CPUs and GPUs, which want different dtypes
        while all of them call one model.
    """
    kinds = {"GPU" if t.gpu_index is not None else "CPU" for t in placement.towers}
    if kinds == {"GPU"}:
        return "float16"
    if kinds == {"CPU"}:
        return "bfloat16"
    raise UsageError(
        f"<mixed_precision=True> <devices={','.join(placement.devices)}>: CPU towers compute "
        "in bfloat16 and GPU towers in float16, but every tower runs the same model; "
        "use only GPU or only CPU towers, or drop <mixed_precision>"
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
