import towers  # first: it keeps TensorFlow's C++ start-up logs off the terminal

import keras
import tensorflow as tf


def make_model(input_shape, num_classes):
    """An MLP whose outputs are logits: no softmax at the end."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(num_classes),
        ],
        name="logits_mlp",
    )


def mean_on_first_tower(tower_grads, devices, destinations):
    """A reducer: add every tower's gradients on the first tower's device,
    divide by the number of towers, and copy the mean to each destination."""
    with tf.device(devices[0]):
        means = [tf.add_n(list(grads)) / len(devices) for grads in zip(*tower_grads)]
    reduced = []
    for destination in destinations:
        with tf.device(destination):
            reduced.append([tf.identity(mean) for mean in means])
    return reduced


trainer = towers.Trainer(
    devices="cpu:2",
    model=make_model,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    optimizer=lambda: keras.optimizers.Adam(2e-3),
    reducer=mean_on_first_tower,
    data=towers.data.mnist(),
)
history = trainer.fit(epochs=2)
result = trainer.evaluate()
print(f"eval accuracy {result['eval_accuracy']:.4f} on {result['eval_samples']} digits")
