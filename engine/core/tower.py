"""One tower's forward and backward pass, on the device scope it is called in.

`tape.gradient` is called inside the tower's device scope, otherwise
TensorFlow would put the backward pass on the current device (the classic
all-gradients-on-gpu:0 trap). The loss is computed in float32 whatever the
layers compute in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import keras
import tensorflow as tf

from engine import scopes
from engine.core.losses import Loss, sample_means, sparse_cross_entropy
from engine.userfn import calling


class TowerResult(NamedTuple):
    """What one tower computed on its batch (a tuple, so tf.function returns it)."""

    loss: tf.Tensor  # mean over the tower's batch
    correct: tf.Tensor  # number of right predictions, float32
    grads: list[tf.Tensor]
    finite: tf.Tensor  # loss and every gradient finite, bool
    top_k_correct: tf.Tensor  # label among the k largest outputs (0 without top_k)
    # With accumulation, the model's non-trainable values after the tower's
    # micro-batches, to be written once every tower has run; else None.
    state: list | None = None


def sample_labels(labels: tf.Tensor) -> tf.Tensor:
    """Labels as the losses take them: [B] for one label per sample (a
    batch of [B, 1]), [B, T] for one per position (a language model's)."""
    labels = tf.convert_to_tensor(labels)
    if labels.shape.rank is not None and labels.shape.rank >= 2 and labels.shape[-1] == 1:
        return tf.reshape(labels, [-1])
    return labels


def count_correct(labels: tf.Tensor, outputs: tf.Tensor, k: int = 1) -> tf.Tensor:
    """Per sample, 1.0 where the label's output (probability or logit) is the
    largest, or with `k` among the k largest (top-k accuracy, as Keras'
    `SparseTopKCategoricalAccuracy`); with a label per position, the
    fraction of positions right."""
    if k == 1:
        predicted = tf.argmax(outputs, axis=-1, output_type=labels.dtype)
        return sample_means(tf.cast(predicted == labels, tf.float32))
    top = tf.math.top_k(outputs, k=k, sorted=False).indices
    hits = tf.reduce_any(top == tf.cast(labels, tf.int32)[..., tf.newaxis], axis=-1)
    return sample_means(tf.cast(hits, tf.float32))


def all_finite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors]))


def forward(model: keras.Model, images, *, training: bool, label: str) -> tf.Tensor:
    """The model's outputs in float32; an error raised inside names the model."""
    doing = "cannot train here:" if training else "cannot evaluate here:"
    with calling("model", label, doing):
        return tf.cast(model(images, training=training), tf.float32)


def _pass(model, images, labels, wrt, scale, loss: Loss, label: str, top_k: int,
          state_scope=None) -> TowerResult:
    """Forward and backward on one batch: the gradients of the mean loss with
    respect to `wrt`, through a loss `scale` and back (None: unscaled), and
    the batch's counts. With `state_scope` (a function giving a Keras
    StatelessScope), the model runs in it and its non-trainable values after
    the batch come back in `state`."""
    labels = sample_labels(labels)
    with tf.GradientTape() as tape:
        if state_scope is None:
            outputs = forward(model, images, training=True, label=label)
        else:
            tape.watch(wrt)
            with state_scope() as scope:
                outputs = forward(model, images, training=True, label=label)
        value = tf.reduce_mean(loss(labels, outputs))
        scaled = value if scale is None else value * scale
    grads = [None if g is None else tf.convert_to_tensor(g) if state_scope else g
             for g in tape.gradient(scaled, wrt)]
    if scale is not None:
        grads = [None if g is None else g / scale for g in grads]
    # No per-tower timestamps here: tf.timestamp is stateful, and tf.function
    # orders stateful ops in program order, which would run the towers one
    # after another. A None gradient (a variable the loss does not use) is
    # the reducer's to report, with a message that says so.
    finite = all_finite([value, *(g for g in grads if g is not None)])
    top = (tf.reduce_sum(count_correct(labels, outputs, top_k)) if top_k
           else tf.constant(0.0))
    state = (None if state_scope is None else
             [scope.get_current_value(v) for v in model.non_trainable_variables])
    return TowerResult(value, tf.reduce_sum(count_correct(labels, outputs)), grads, finite,
                       top, state)


def tower_gradients(
    model: keras.Model, images, labels, scale=None, loss: Loss = sparse_cross_entropy,
    model_label: str | None = None, top_k: int = 0,
) -> TowerResult:
    """Forward and backward of one tower on one batch.

    With a loss `scale` (a float32 scalar), the backward pass starts from
    the scaled loss and the gradients are divided by the scale again, here
    on the tower. `loss` gives one value per sample (engine.core.losses);
    with `top_k`, the samples whose label is among the k largest outputs
    are counted too.
    """
    return _pass(model, images, labels, model.trainable_variables, scale, loss,
                 model_label or model.name, top_k)


def accumulated(
    model: keras.Model, images, labels, scale=None, loss: Loss = sparse_cross_entropy,
    model_label: str | None = None, top_k: int = 0,
) -> TowerResult:
    """`tower_gradients` over K micro-batches (`images` and `labels`
    stacked [K, B, ...]) one after another, and their mean gradient.

    The tower reads the weights once; then the micro-batches run in turn
    (the first, then a `tf.while_loop` of one iteration at a time over the
    rest) on those values, the model called as usual inside a
    `keras.StatelessScope`: one micro-batch's activations are alive at a
    time, and weights kept on another device cross to the tower once per
    step, not once per micro-batch. The model's other state (BatchNorm's
    moving statistics, dropout's seeds) goes from one micro-batch to the
    next and comes back in `state`, for the caller to write once all
    towers have run. Micro-batches of one size make the mean of their
    losses and gradients those of one batch of all K x B samples, within
    rounding; BatchNorm aside, which normalises by each micro-batch's own
    statistics. A gradient TensorFlow gives as slices (an embedding's) is
    summed dense; one the loss does not reach stays None.
    """
    trainable, others = model.trainable_variables, model.non_trainable_variables
    weights = [tf.identity(v) for v in trainable]
    name = model_label or model.name

    def one(k, state):
        mapping = list(zip(trainable, weights)) + list(zip(others, state))
        return _pass(model, images[k], labels[k], weights, scale, loss, name, top_k,
                     lambda: keras.StatelessScope(state_mapping=mapping))

    first = one(0, [tf.identity(v) for v in others])
    present = [i for i, g in enumerate(first.grads) if g is not None]

    def body(k, state, loss_sum, correct, top, finite, sums):
        result = one(k, state)
        return (k + 1, result.state, loss_sum + result.loss, correct + result.correct,
                top + result.top_k_correct, tf.logical_and(finite, result.finite),
                [total + result.grads[i] for total, i in zip(sums, present)])

    count = tf.shape(images)[0]
    _, state, loss_sum, correct, top, finite, sums = tf.while_loop(
        lambda k, *_: k < count, body,
        (tf.constant(1), first.state, first.loss, first.correct, first.top_k_correct,
         first.finite, [first.grads[i] for i in present]),
        parallel_iterations=1)
    share = 1.0 / tf.cast(count, tf.float32)
    grads = [None] * len(first.grads)
    for i, total in zip(present, sums):
        grads[i] = total * tf.cast(share, total.dtype)
    return TowerResult(loss_sum * share, correct, grads, finite, top, state)


def evaluation_counts(model, images, labels, valid, loss: Loss, label: str,
                      top_k: int) -> tf.Tensor:
    """A tower's held-out sums over the first `valid` samples of its batch
    (the rest are the shard's padding): [loss sum, correct, samples] and,
    with `top_k`, the top-k count."""
    labels = sample_labels(labels)
    outputs = forward(model, images, training=False, label=label)
    real = tf.cast(tf.range(tf.shape(labels)[0]) < valid, tf.float32)
    counts = [tf.reduce_sum(loss(labels, outputs) * real),
              tf.reduce_sum(count_correct(labels, outputs) * real), tf.reduce_sum(real)]
    if top_k:
        counts.append(tf.reduce_sum(count_correct(labels, outputs, top_k) * real))
    return tf.stack(counts)


def write_state(models: Sequence[keras.Model], results: Sequence[TowerResult]) -> None:
    """With accumulation, each model copy's non-trainable variables take the
    values its towers' micro-batches left (`models[k]` is tower k's copy),
    written after every tower has read them, so no tower waits for another's
    loop. A copy shared by several towers takes the mean of their
    floating-point values (BatchNorm's moving statistics, moved by every
    tower's batches) and the last tower's others (dropout's seed counters).
    Called on the step's own device (the reduce device), where a shared copy
    lives."""
    copies = {}
    for model, result in zip(models, results):
        copies.setdefault(id(model), (model, []))[1].append(result.state)
    for model, states in copies.values():
        with tf.name_scope(scopes.UPDATE):
            for k, variable in enumerate(model.non_trainable_variables):
                values = [state[k] for state in states]
                if tf.as_dtype(variable.dtype).is_floating and len(values) > 1:
                    variable.assign(tf.add_n(values) / len(values))
                else:
                    variable.assign(values[-1])
