import towers
from towers.callbacks import Callback, EarlyStopping


class Best(Callback):
    """Keeps the best held-out accuracy; Keras' names (val_*) work too."""

    def __init__(self):
        self.best = 0.0

    def on_epoch_end(self, epoch, logs):
        self.best = max(self.best, logs["val_accuracy"])
        print(f"epoch {epoch + 1}: val_accuracy {logs['val_accuracy']:.3f} (best {self.best:.3f})")


best = Best()
trainer = towers.Trainer("cpu:2", model="mlp")
history = trainer.fit(epochs=20, steps_per_epoch=40, eval_steps=20, verbose=0,
                      callbacks=[best, EarlyStopping(monitor="val_loss", patience=1)])
print(f"stopped after {len(history)} of 20 epochs; best val_accuracy {best.best:.3f}")
