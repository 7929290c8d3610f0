"""The small MNIST models: the Keras example MLP and LeNet-5."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # keras imports TensorFlow: only once a model is built
    import keras

__all__ = ["lenet", "mlp"]


def mlp(input_shape: Sequence[int], num_classes: int, *, dropout: float = 0.2) -> keras.Model:
    """Flatten, Dense 128 relu, Dropout, Dense softmax: the Keras MNIST MLP.

    Args:
      input_shape: one sample's shape, (28, 28, 1) for MNIST.
      num_classes: outputs of the softmax.
      dropout: the fraction of the hidden layer dropped in training.

    Returns:
      The keras.Model, its outputs probabilities.
    """
    import keras

    layers = [
        keras.Input(input_shape),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
    ]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(num_classes, activation="softmax"))
    return keras.Sequential(layers, name="mlp")


def lenet(input_shape: Sequence[int], num_classes: int) -> keras.Model:
    """LeNet-5: two 5x5 convolutions with max pooling, then 120-84-classes.

    Args:
      input_shape: one image's (height, width, channels).
      num_classes: outputs of the softmax.

    Returns:
      The keras.Model, its outputs probabilities.
    """
    import keras

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
