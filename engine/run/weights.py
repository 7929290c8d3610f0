"""Weights from elsewhere: a run's initial weights (`init_weights`) from a
Keras model file or a checkpoint of this engine, and the values of the
model in a checkpoint (the best one, for `Trainer.save`).

A checkpoint of this engine holds the model as the list of its variables
(`model/<i>`, or tower 0's copy `models/0/<i>` with replicated variables),
in the order of `model.variables`; a `.keras` file holds a whole model,
whose `variables` come in the same order when it is the same model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from engine.errors import UsageError

__all__ = ["check_path", "checkpoint_values", "load_into", "saved_values"]

_KEY = re.compile(r"^(?:model|models/0)/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE$")


def check_path(path: str) -> None:
    """Refuses an `init_weights` that is neither a `.keras` file nor a
    checkpoint (a folder with one, or a `ckpt-N` prefix), before TensorFlow
    starts.

    Raises:
      UsageError: naming the path and what would do.
    """
    if path.endswith(".keras"):
        if not os.path.isfile(path):
            raise UsageError(f"<init_weights> {path}: no such file")
        return
    if os.path.isfile(path + ".index") or os.path.isfile(os.path.join(path, "checkpoint")):
        return
    raise UsageError(
        f"<init_weights> {path}: not a .keras file (as Trainer.save writes) nor a "
        "checkpoint of this engine (a <checkpoint_dir>, or its ckpt-N)"
    )


def checkpoint_values(path: str) -> list[np.ndarray]:
    """The model's variables, in order, from a checkpoint of this engine
    (`path` a checkpoint folder, its newest is read, or a `ckpt-N` prefix).

    Raises:
      UsageError: a folder with no checkpoint, or a checkpoint with no model.
    """
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(path) if os.path.isdir(path) else path
    if prefix is None:
        raise UsageError(f"<init_weights> {path}: the folder holds no checkpoint")
    reader = tf.train.load_checkpoint(prefix)
    found = {}
    for key in reader.get_variable_to_shape_map():
        match = _KEY.match(key)
        if match:
            found[int(match.group(1))] = reader.get_tensor(key)
    if not found:
        raise UsageError(f"<init_weights> {prefix} holds no model variables")
    return [found[i] for i in sorted(found)]


def saved_values(path: str) -> list[np.ndarray]:
    """The model's variables, in order, from a `.keras` file or a checkpoint."""
    if not path.endswith(".keras"):
        return checkpoint_values(path)
    import keras

    try:
        saved = keras.models.load_model(path, compile=False)
    except Exception as err:  # a missing custom class, a damaged file
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise UsageError(f"<init_weights> {path} cannot be loaded: "
                         f"{first or type(err).__name__}") from None
    return [np.asarray(v.numpy()) for v in saved.variables]


def load_into(models: Sequence, values: Sequence[np.ndarray], path: str,
              model_name: str) -> int:
    """Assigns `values` to every model's variables; returns how many.

    Raises:
      UsageError: the values do not fit: the first variable whose shape
        differs, by its layer, or a different number of variables.
    """
    variables = list(models[0].variables)
    for variable, value in zip(variables, values):
        if tuple(variable.shape) != tuple(value.shape):
            # `mlp/dense/kernel`: the layer is the part before the variable's name.
            layer, _, name = variable.path.rpartition("/")
            raise UsageError(
                f"<init_weights> {path} does not fit <model={model_name}>: layer "
                f"{layer.rpartition('/')[2] or name} has a {name} of shape "
                f"{tuple(variable.shape)}, the file's is {tuple(value.shape)}"
            )
    if len(values) != len(variables):
        raise UsageError(
            f"<init_weights> {path} holds {len(values)} variables, <model={model_name}> "
            f"has {len(variables)}; it was saved from another model"
        )
    for model in models:
        for variable, value in zip(model.variables, values):
            variable.assign(value)
    return len(values)


def export(model, path: str, checkpoint: str | None, model_name: str) -> str:
    """Writes `model` where a user can load it without this package: a Keras
    model file for a `path` ending in `.keras`, else a SavedModel for
    inference; with `checkpoint`, that checkpoint's weights (the model's own
    are put back after).

    Raises:
      UsageError: a path that cannot be written (`<save_model>`).
    """
    from engine.run import outputs

    if path.endswith(".keras"):
        outputs.check_file("save_model", path)
    else:
        outputs.check_directory("save_model", path)
    latest = [v.numpy() for v in model.variables] if checkpoint else None
    if checkpoint:
        load_into([model], checkpoint_values(checkpoint), checkpoint, model_name)
    try:
        if path.endswith(".keras"):
            model.save(path)
        else:
            model.export(path, verbose=False)
    finally:
        if latest is not None:
            for variable, value in zip(model.variables, latest):
                variable.assign(value)
    return path
