"""nccl: NVIDIA's NCCL all-reduce between GPU towers (GPU only).

Uses TensorFlow's NCCL op (`nccl_ops.all_sum`: one NcclAllReduce per GPU, same
shared name) and divides by the tower count on each GPU. NCCL exists only for
NVIDIA GPUs, so the reducer refuses CPU towers when it is built, with a
message naming them, before any graph is made.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine.devices import split_name
from engine.reducers.base import FlatReducer, ReducerError


class Nccl:
    def __init__(self, devices: Sequence[str]):
        not_gpu = [d for d in devices if split_name(d)[0] != "gpu"]
        if not_gpu:
            raise ReducerError(
                f"--reducer nccl needs GPU towers (NCCL runs on NVIDIA GPUs); "
                f"{', '.join(not_gpu)} {'is' if len(not_gpu) == 1 else 'are'} not; "
                "use --reducer ring or collective"
            )
        if not tf.config.list_physical_devices("GPU"):
            raise ReducerError("--reducer nccl needs a GPU, and this machine has none")

    @staticmethod
    def all_reduce(flats, devices):
        from tensorflow.python.ops import nccl_ops

        sums = nccl_ops.all_sum(flats)  # one NcclAllReduce per GPU, on its device
        out = []
        for total, device in zip(sums, devices):
            with tf.device(device):
                out.append(total / tf.cast(len(devices), total.dtype))
        return out

    def __call__(self, tower_grads, devices, destinations):
        return FlatReducer(self.all_reduce)(tower_grads, devices, destinations)
