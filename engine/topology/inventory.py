"""What devices TensorFlow sees on this host, and why a GPU it cannot see is missing.

`tower-train --list-devices` prints these lines: the check, after set-up,
that the towers a user means to name are there.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

__all__ = ["device_lines", "driver_gpus"]


def driver_gpus() -> list[str]:
    """The GPUs the NVIDIA driver lists (`nvidia-smi -L`), whatever
    TensorFlow makes of them; empty without a driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split(" (UUID")[0] for line in listed.stdout.splitlines()
            if line.startswith("GPU ")]


def device_lines() -> list[str]:
    """One line per device TensorFlow sees (its name for `devices`, what it
    is), then a line saying why GPUs the driver lists are not among them,
    where that is so (with argument markers, engine.errors)."""
    import os

    import tensorflow as tf

    lines = [f"/cpu:0   CPU, {os.cpu_count()} cores (cpu:N splits it into N towers)"]
    gpus = tf.config.list_physical_devices("GPU")
    for k, gpu in enumerate(gpus):
        details = tf.config.experimental.get_device_details(gpu)
        capability = ".".join(map(str, details.get("compute_capability", ()))) or "?"
        lines.append(f"/gpu:{k}   {details.get('device_name', 'GPU')}, compute capability "
                     f"{capability}")
    listed = driver_gpus()
    if listed and not gpus:
        found = f"no GPU for TensorFlow: the driver lists {len(listed)} ({listed[0]}), but "
        if not tf.test.is_built_with_cuda() or importlib.util.find_spec("nvidia.cublas") is None:
            lines.append(
                found + "this environment has no CUDA libraries for TensorFlow (it was set "
                "up where nvidia-smi did not answer); remove .venv and run ./scripts/setup "
                "again on this machine")
        else:
            lines.append(
                found + "TensorFlow cannot open it: its CUDA 12 libraries need NVIDIA driver "
                "525 or newer; TF_CPP_MIN_LOG_LEVEL=0 shows TensorFlow's own reason")
    elif not listed and not gpus:
        lines.append("no GPU: no NVIDIA driver answers here (nvidia-smi); CPU towers only")
    return lines
