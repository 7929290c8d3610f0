"""nccl: NVIDIA's NCCL all-reduce between GPU towers (GPU only).

Uses TensorFlow's NCCL op (`nccl_ops.all_sum`: one NcclAllReduce per GPU, same
shared name) and divides by the tower count on each GPU. NCCL exists only for
NVIDIA GPUs, so the reducer refuses CPU towers when it is built, with a
message naming them, before any graph is made. NCCL also needs one GPU per
rank: two towers on logical GPUs of one physical GPU (`devices="gpu:N"`)
would wait for each other forever, so those are refused too.
"""

from __future__ import annotations

import tensorflow as tf

from engine.reducers.base import ReducerError
from engine.reducers.flat import FlatReducer
from engine.topology.devices import Placement, split_name


class Nccl:
    def __init__(self, placement: Placement):
        devices = placement.devices
        not_gpu = [d for d in devices if split_name(d)[0] != "gpu"]
        if not_gpu:
            raise ReducerError(
                f"<reducer=nccl> needs GPU towers (NCCL runs on NVIDIA GPUs); "
                f"{', '.join(not_gpu)} {'is' if len(not_gpu) == 1 else 'are'} not; "
                "use <reducer=ring> or collective"
            )
        shared = placement.shared_gpus()
        if shared:
            gpu, names = next(iter(shared.items()))
            raise ReducerError(
                f"<reducer=nccl>: towers {', '.join(names)} share physical GPU {gpu}, "
                "and NCCL needs one GPU per tower (it would wait forever); use "
                "<reducer=ring>, tree or collective"
            )
        if not tf.config.list_physical_devices("GPU"):
            raise ReducerError("<reducer=nccl> needs a GPU, and this machine has none")

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
