"""The model zoo: `mlp`, `lenet`, or the user's own `package.module:function`.

A model maps images [B, H, W, C] in [0, 1] to class probabilities [B, classes]
(softmax outputs, as Keras' MNIST examples have them). It is built once, under
the reduce device, and every tower calls the same instance.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import keras

from engine.userfn import load_function


class ModelError(ValueError):
    """A `--model` that cannot be built; the message is one line."""


def mlp(input_shape, num_classes, dropout: float = 0.2) -> keras.Model:
    """Flatten, Dense 128 relu, Dropout, Dense softmax: the Keras MNIST MLP."""
    layers = [
        keras.Input(input_shape),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
    ]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(num_classes, activation="softmax"))
    return keras.Sequential(layers, name="mlp")


def lenet(input_shape, num_classes) -> keras.Model:
    """LeNet-5: two 5x5 convolutions with max pooling, then 120-84-classes."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 5, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(120, activation="relu"),
            keras.layers.Dense(84, activation="relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ],
        name="lenet",
    )


ZOO: dict[str, Callable[..., keras.Model]] = {"mlp": mlp, "lenet": lenet}


def resolve(name: str) -> Callable[..., keras.Model]:
    """The model function for a zoo name or `package.module:function`.

    Raises:
      ModelError: naming the value and what would be valid.
    """
    if name in ZOO:
        return ZOO[name]
    if ":" not in name:
        raise ModelError(
            f"--model {name!r} is not one of {', '.join(ZOO)} and not "
            "package.module:function"
        )
    return load_function(name, "--model", ModelError)


def build(name: str, input_shape, num_classes: int) -> keras.Model:
    """Builds the model; user functions get `input_shape` and `num_classes`
    when they declare those parameters."""
    fn = resolve(name)
    wanted = inspect.signature(fn).parameters
    kwargs = {
        key: value
        for key, value in (("input_shape", tuple(input_shape)), ("num_classes", num_classes))
        if key in wanted
    }
    model = fn(**kwargs)
    if not isinstance(model, keras.Model):
        raise ModelError(
            f"--model {name!r} returned {type(model).__name__}, not a keras.Model"
        )
    if not model.built:
        model.build((None, *input_shape))
    return model
