import towers

# The ResNet-50 recipe's parts, small: LeNet on MNIST on two CPU towers.
# Momentum SGD warmed up over an epoch, then a cosine; label smoothing,
# decoupled weight decay, clipping; two batches of 32 accumulated per tower
# and step; top-5 accuracy; the best epoch kept by its held-out accuracy.
trainer = towers.Trainer("cpu:2", model="lenet", optimizer="momentum", learning_rate=0.1,
                         lr_schedule="cosine", warmup_epochs=1, label_smoothing=0.1,
                         weight_decay=5e-5, clip_norm=5.0, batch_size=32, accumulate=2,
                         metrics_top_k=5)
history = trainer.fit(epochs=3, steps_per_epoch=20, verbose=0,
                      checkpoint_dir="recipe", keep_best="eval_accuracy")
for record in history:
    print(f"epoch {record['epoch']}: eval_accuracy {record['eval_accuracy']:.4f}, "
          f"eval_top5_accuracy {record['eval_top5_accuracy']:.4f}")
trainer.save("best.keras", best=True)

# Another run starts from the best epoch's weights (to fine-tune, say).
again = towers.Trainer("cpu:2", model="lenet", init_weights="best.keras")
print(f"best.keras: eval_accuracy {again.evaluate()['eval_accuracy']:.4f}")
