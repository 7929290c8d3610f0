import towers

# Two towers, each a logical CPU device with its own DALI shard of real MNIST;
# the gradients averaged by a ring all-reduce between them.
trainer = towers.Trainer("cpu:2", model="lenet", reducer="ring")
history = trainer.fit(epochs=1, steps_per_epoch=150, verbose=2)
print(f"held-out accuracy {history[-1]['eval_accuracy']:.3f}")
trainer.save("lenet.keras")  # loads with keras.models.load_model, without towers
