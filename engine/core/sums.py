"""The epoch's running sums, kept on the reduce device and read once per
progress line: what the step adds after each update, and the averages."""

from __future__ import annotations

import tensorflow as tf


class EpochSums:
    """Loss, correct predictions, samples and updated steps since the epoch
    began (and, with `top_k`, the top-k count); only updated steps count.

    Args:
      top_k: the k of the top-k count (0: none).
    """

    def __init__(self, top_k: int = 0):
        self.top_k = top_k
        self.loss = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.correct = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.samples = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.top_k_correct = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    @property
    def top_k_name(self) -> str | None:
        """The top-k accuracy's name in outputs and records (`top5_accuracy`),
        or None without `top_k`."""
        return f"top{self.top_k}_accuracy" if self.top_k else None

    def trackables(self) -> dict:
        """What a checkpoint holds of them; the top-k count under its own key,
        so that a checkpoint written without top-k still restores
        (engine.run.checkpoint.OPTIONAL)."""
        return {"epoch_sums": [self.loss, self.correct, self.samples, self.steps],
                **({"top_k_sum": self.top_k_correct} if self.top_k else {})}

    def add(self, updates: tf.Tensor, loss, correct, samples, top_k_correct) -> None:
        """Adds one step's figures where `updates` is true (selects, not
        branches)."""
        zero = tf.constant(0.0, tf.float64)
        self.loss.assign_add(tf.where(updates, tf.cast(loss, tf.float64), zero))
        self.correct.assign_add(tf.where(updates, tf.cast(correct, tf.float64), zero))
        self.samples.assign_add(tf.where(updates, samples, zero))
        if self.top_k:
            self.top_k_correct.assign_add(
                tf.where(updates, tf.cast(top_k_correct, tf.float64), zero))
        self.steps.assign_add(tf.cast(updates, tf.int64))

    def reset(self) -> None:
        for var in (self.loss, self.correct, self.samples, self.top_k_correct):
            var.assign(0.0)
        self.steps.assign(0)

    def averages(self) -> dict[str, float | None]:
        """The epoch's averages so far: loss as Keras reports it (mean of step
        losses). With no updated step yet (every step so far skipped or an
        overflow of the loss scale) loss and accuracy are None, not 0."""
        steps = int(self.steps.numpy())
        top = {self.top_k_name: None} if self.top_k else {}
        if not steps:
            return {"steps": 0, "loss": None, "accuracy": None, **top}
        samples = float(self.samples.numpy())
        if self.top_k:
            top[self.top_k_name] = float(self.top_k_correct.numpy()) / samples
        return {
            "steps": steps,
            "loss": float(self.loss.numpy()) / steps,
            "accuracy": float(self.correct.numpy()) / samples,
            **top,
        }
