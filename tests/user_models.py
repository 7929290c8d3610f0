"""A user's own model, loaded by the CLI tests as tests.user_models:tiny."""

import keras


def tiny(input_shape, num_classes):
    """Softmax regression: the smallest model tower-train can train."""
    return keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(),
         keras.layers.Dense(num_classes, activation="softmax")],
        name="tiny",
    )
