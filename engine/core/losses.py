"""The loss a tower minimises: one value per sample, from (labels, outputs).

With a label per position (a language model's [B, T]), a loss may give one
value per position; the sample's value is their mean.

The step averages a tower's per-sample losses over its batch, and evaluation
sums them over the real (not padding) samples only, so a loss must give one
value per sample. The default is today's: cross-entropy of integer labels
against softmax outputs. A Keras loss object works as given (its unreduced
`call` is used), so does a function of (labels, outputs).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from engine.errors import UsageError
from engine.userfn import calling, check_signature, label

__all__ = ["Loss", "logits_cross_entropy", "per_sample", "sample_means", "smoothed",
           "sparse_cross_entropy"]

Loss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def sparse_cross_entropy(labels: tf.Tensor, probs: tf.Tensor) -> tf.Tensor:
    """Per-sample cross-entropy of integer labels against softmax outputs."""
    return keras.losses.sparse_categorical_crossentropy(labels, probs)


def logits_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-sample cross-entropy of integer labels against logits."""
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def smoothed(smoothing: float, from_logits: bool = False) -> Loss:
    """Cross-entropy of integer labels with label smoothing: the target puts
    1 - smoothing + smoothing/K on the label and smoothing/K on each of the K
    classes (Szegedy et al.; Keras' `CategoricalCrossentropy(label_smoothing=)`,
    which takes one-hot labels)."""

    def loss(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        one_hot = tf.one_hot(labels, tf.shape(outputs)[-1], dtype=outputs.dtype)
        return keras.losses.categorical_crossentropy(
            one_hot, outputs, from_logits=from_logits, label_smoothing=smoothing)

    return loss


def per_sample(loss: Loss | keras.losses.Loss | None, from_logits: bool = False,
               label_smoothing: float = 0.0) -> Loss:
    """The per-sample loss function for the `loss` a user gave.

    Args:
      loss: None (cross-entropy of softmax outputs, or of logits with
        `from_logits`), a `keras.losses.Loss`
        (e.g. `SparseCategoricalCrossentropy(from_logits=True)`), or a
        function of (labels [B] int32, outputs [B, ...] float32) returning [B]
        (with labels per position, [B, T] and [B, T, ...], returning [B, T]
        or [B]).

      from_logits: the default loss takes logits.
      label_smoothing: the default loss with label smoothing (`smoothed`).

    Returns:
      A function of (labels, outputs) that returns one float32 value per sample.

    Raises:
      UserCodeError: a function that does not take (labels, outputs).
      UsageError: at trace time, a loss that returns a scalar (a Keras loss
        is unreduced here; a function must not reduce).
    """
    if loss is None and label_smoothing:
        return _per_sample(smoothed(label_smoothing, from_logits))
    if loss is None:
        return _per_sample(logits_cross_entropy if from_logits else sparse_cross_entropy)
    if isinstance(loss, keras.losses.Loss):
        function, name = loss.call, type(loss).__name__
    elif callable(loss):
        check_signature(loss, "loss", "a loss takes (labels, outputs)", "labels", "outputs")
        function, name = loss, label(loss)
    else:
        raise UsageError(
            f"<loss> {loss!r} is not a keras.losses.Loss or a function of (labels, outputs)"
        )

    def values(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        with calling("loss", name):
            result = tf.cast(function(labels, outputs), tf.float32)
        if result.shape.rank == 0:
            raise UsageError(
                f"<loss> {name!r} returned one value for the batch; return one per "
                "sample (the engine averages over the batch and masks padding)"
            )
        return result

    return _per_sample(values)


def sample_means(values: tf.Tensor) -> tf.Tensor:
    """[B] values unchanged; [B, T, ...] values averaged into one per sample."""
    rank = values.shape.rank
    if rank is None or rank <= 1:
        return values
    return tf.reduce_mean(values, axis=list(range(1, rank)))


def _per_sample(loss: Loss) -> Loss:
    """`loss` with any per-position values averaged into one per sample."""

    def values(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return sample_means(tf.cast(loss(labels, outputs), tf.float32))

    return values
