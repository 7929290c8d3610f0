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


class PoisonOnTower1(keras.layers.Layer):
    """Passes its input through, except on tower 1 (/cpu:1) from its call
    number `after` + 1 on, in training, where it returns NaN: a loss that
    turns non-finite at a known step on a known tower."""

    def __init__(self, after, **kwargs):
        super().__init__(**kwargs)
        self.after = after

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="calls")

    def call(self, x, training=False):
        import tensorflow as tf

        if not training or not getattr(x, "device", "").endswith("CPU:1"):
            return x
        self.calls.assign_add(1.0)
        return x * tf.where(self.calls > self.after, float("nan"), 1.0)


def nan_on_tower_1_at_step_6(input_shape, num_classes):
    """Softmax regression whose tower 1 goes non-finite at step 6."""
    return keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(), PoisonOnTower1(5),
         keras.layers.Dense(num_classes, activation="softmax")],
        name="nan_at_6",
    )


def needs_width(width, input_shape, num_classes):
    """Wrong on purpose: the contract passes only input_shape and num_classes."""
    return tiny(input_shape, num_classes)


def logits(input_shape, num_classes):
    """An MLP that outputs logits: no softmax at its end."""
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(num_classes),
    ], name="logits")


def three_classes(input_shape, num_classes):
    """A model with three outputs whatever the data's classes are."""
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Flatten(),
        keras.layers.Dense(3, activation="softmax"),
    ], name="three_classes")
