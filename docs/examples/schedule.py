import towers


class EveryFifthRate(towers.callbacks.Callback):
    """Prints the rate of every fifth step's update."""

    def on_train_batch_end(self, batch, logs):
        if logs["step"] % 5 == 0:
            print(f"step {logs['step']:2d}: learning rate {logs['learning_rate']:.4f}")


# Momentum SGD at 0.1, warmed up linearly over the first epoch, then a
# cosine down to 0 at the last step.
trainer = towers.Trainer("cpu:2", optimizer="momentum", learning_rate=0.1,
                         lr_schedule="cosine", warmup_epochs=1)
history = trainer.fit(epochs=3, steps_per_epoch=10, eval_steps=10, verbose=0,
                      callbacks=[EveryFifthRate()])
print(f"held-out accuracy {history[-1]['eval_accuracy']:.2f}")
