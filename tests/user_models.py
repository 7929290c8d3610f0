"""A user's own model, loaded by the CLI tests as tests.user_models:tiny."""

import keras


def tiny(input_shape, num_classes):
    """Softmax regression: the smallest model tower-train can train."""
    return keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(),
         keras.layers.Dense(num_classes, activation="softmax")],
        name="tiny",
    )


class OnHost(keras.layers.Layer):
    """Computes on /cpu:0 whatever tower calls it: a deliberately stray op."""

    def call(self, x):
        import tensorflow as tf

        with tf.device("/cpu:0"):
            return tf.math.square(x)


def misplaced(input_shape, num_classes):
    """An MLP with one layer pinned to /cpu:0, for the placement log's stray check."""
    return keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(), OnHost(name="on_host"),
         keras.layers.Dense(num_classes, activation="softmax")],
        name="misplaced",
    )
