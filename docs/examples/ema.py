import towers  # first: it keeps TensorFlow's C++ start-up logs off the terminal

import keras

# Momentum SGD whose weights are averaged as it goes (momentum 0.9: about
# the last ten updates): the held-out figures are the averages', and so is
# the saved model.
trainer = towers.Trainer("cpu:2", optimizer="momentum", learning_rate=0.05, ema=0.9)
history = trainer.fit(epochs=2, steps_per_epoch=50, eval_steps=20, verbose=0)
print(f"held-out accuracy of the averaged weights {history[-1]['eval_accuracy']:.2f}")
saved = keras.models.load_model(trainer.save("averaged.keras"))
same = all((a == b.numpy()).all() for a, b in zip(saved.get_weights(), trainer.model.weights))
print(f"saved the averages: {same}")
