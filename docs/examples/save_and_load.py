import towers  # first: it keeps TensorFlow's C++ start-up logs off the terminal

import keras
import numpy as np

trainer = towers.Trainer("cpu:2", model="mlp")
trainer.fit(epochs=1, steps_per_epoch=100, verbose=0)
path = trainer.save("mlp.keras")

# Anyone can load it with Keras alone: the zoo's models need nothing else.
model = keras.models.load_model(path)
digits = np.zeros((3, 28, 28, 1), np.float32)
print(model.predict(digits, verbose=0).shape)
