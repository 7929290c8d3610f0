"""The training and evaluation steps: every tower, the reduction, the update.

Each tower runs forward *and* backward under its own `tf.device`:
`tape.gradient` is called inside the tower's device scope, otherwise
TensorFlow would put the backward pass on the current device (the classic
all-gradients-on-gpu:0 trap). Variables live on the reduce device; towers read
them. One `tf.function` holds all towers, the reduction and the update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import keras
import tensorflow as tf

from engine import scopes
from engine.core.loss_scale import NoLossScale
from engine.core.losses import Loss, sample_means, sparse_cross_entropy
from engine.core.on_device import OnDevice
from engine.core.variables import VariableMode
from engine.reducers.base import Reducer, mean
from engine.reducers.stateful import ReducerContext, build_state, stateful_part
from engine.topology.devices import Placement
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


class Reduced(NamedTuple):
    """What the towers computed together on one step."""

    grads: list[list[tf.Tensor]]  # one list per destination of the variable mode
    loss: tf.Tensor  # mean over towers
    correct: tf.Tensor  # total over towers
    finite: tf.Tensor  # [towers] bool
    top_k_correct: tf.Tensor  # total over towers


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


def tower_gradients(
    model: keras.Model, images, labels, scale=None, loss: Loss = sparse_cross_entropy,
    model_label: str | None = None, top_k: int = 0,
) -> TowerResult:
    """Forward and backward of one tower, on the device scope it is called in.

    The loss is computed in float32 whatever the layers compute in. With a
    loss `scale` (a float32 scalar), the backward pass starts from the scaled
    loss and the gradients are divided by the scale again, here on the tower.
    `loss` gives one value per sample (engine.core.losses); with `top_k`,
    the samples whose label is among the k largest outputs are counted too.
    """
    labels = sample_labels(labels)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        with calling("model", model_label or model.name, "cannot train here:"):
            outputs = tf.cast(model(images, training=True), tf.float32)
        loss = tf.reduce_mean(loss(labels, outputs))
        scaled = loss if scale is None else loss * scale
    grads = tape.gradient(scaled, variables)
    if scale is not None:
        grads = [None if g is None else g / scale for g in grads]
    # No per-tower timestamps here: tf.timestamp is stateful, and tf.function
    # orders stateful ops in program order, which would run the towers one
    # after another.
    # A None gradient (a variable the loss does not use) is the reducer's to
    # report, with a message that says so.
    finite = all_finite([loss, *(g for g in grads if g is not None)])
    top = (tf.reduce_sum(count_correct(labels, outputs, top_k)) if top_k
           else tf.constant(0.0))
    return TowerResult(loss, tf.reduce_sum(count_correct(labels, outputs)), grads, finite, top)


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
        batch_labels = sample_labels(labels[k])
        mapping = list(zip(trainable, weights)) + list(zip(others, state))
        with tf.GradientTape() as tape:
            tape.watch(weights)
            with keras.StatelessScope(state_mapping=mapping) as scope, calling(
                    "model", name, "cannot train here:"):
                outputs = tf.cast(model(images[k], training=True), tf.float32)
            value = tf.reduce_mean(loss(batch_labels, outputs))
            scaled = value if scale is None else value * scale
        grads = [None if g is None else tf.convert_to_tensor(g)
                 for g in tape.gradient(scaled, weights)]
        if scale is not None:
            grads = [None if g is None else g / scale for g in grads]
        top = (tf.reduce_sum(count_correct(batch_labels, outputs, top_k)) if top_k
               else tf.constant(0.0))
        return TowerResult(value, tf.reduce_sum(count_correct(batch_labels, outputs)), grads,
                           all_finite([value, *(g for g in grads if g is not None)]), top,
                           [scope.get_current_value(v) for v in others])

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


class TowerStep:
    """Builds and holds the step functions for one placement.

    Args:
      variables: the variable mode (engine.core.variables): which model copy each
        tower calls, where the reduced gradients go, how the update applies.
      placement: the towers and the reduce device (which also keeps the
        epoch's metric sums).
      reducer: turns the towers' gradient lists into the mean gradients on the
        variable mode's destinations (engine.reducers); one with state
        (engine.reducers.stateful) is built here for the model's gradients,
        and its state is part of `trackables`.
      loss_scale: engine.core.loss_scale.NoLossScale, or DynamicLossScale for
        float16 towers.
      xla: compile with XLA. When the towers, the variables and the reduce
        device are one device (one tower whose variables live on it), the
        whole step after the input (forward, backward, reduction, loss
        scale, the non-finite skip, the update and the metric sums) is one
        compiled program, as Keras' `jit_compile` compiles its train step:
        nothing in it waits on the host. Otherwise each tower's forward and
        backward is one cluster on its device; the cluster reads the
        variables itself, so they must be on the tower's device.
      loss: per-sample loss of (labels, outputs) (engine.core.losses);
        default: cross-entropy of softmax outputs.
      clip_norm: scale the reduced gradients so their global norm is at
        most this (after the reduction: every copy applies the same
        clipped mean); the step's `grad_norm` output is the norm before.
      top_k: also count the samples whose label is among the k largest
        outputs (`top_k_name`, top-5 accuracy for k=5); 0: not.
      accumulate: micro-batches per tower per step (gradient
        accumulation): each tower takes this many batches in turn and
        averages their gradients (`accumulated`) before the one reduction
        and update of the step.
      model_label, reducer_label: how messages name the model and the
        reducer when they raise.
    """

    def __init__(
        self,
        *,
        variables: VariableMode,
        placement: Placement,
        reducer: Reducer,
        loss_scale=None,
        xla: bool = False,
        loss: Loss = sparse_cross_entropy,
        model_label: str | None = None,
        reducer_label: str = "reducer",
        clip_norm: float | None = None,
        top_k: int = 0,
        accumulate: int = 1,
    ):
        self.variables = variables
        self.model = variables.model
        self.placement = placement
        self.reducer = reducer
        self.loss_scale = loss_scale or NoLossScale()
        self.xla = xla
        self.loss = loss
        self.model_label = model_label or self.model.name
        self.reducer_label = reducer_label
        self.clip_norm = clip_norm
        self.top_k = top_k
        self.accumulate = accumulate

        one_tower = accumulated if accumulate > 1 else tower_gradients

        def forward_backward(model, images, labels, scale):
            return one_tower(model, images, labels, scale, loss, self.model_label, top_k)

        # With the whole step compiled, the towers are part of that program.
        self.whole_step = xla and placement.one_device
        per_tower = xla and not self.whole_step
        # One compiled function; it is traced once per model copy it is given.
        self._tower_gradients = (
            tf.function(forward_backward, jit_compile=True) if per_tower else forward_backward
        )
        self._update_on = self._update_on_batches
        self._evaluate_on = self._evaluate_on_batches
        if self.whole_step:
            self._update_on = tf.function(self._update_on_batches, jit_compile=True)
            self._evaluate_on = tf.function(self._evaluate_on_batches, jit_compile=True)
        with tf.device(placement.reduce_device):
            # Running sums for the epoch's averages, read once per progress line.
            self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            self.correct_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            self.samples = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.top_k_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            # Steps taken since the run began, and steps whose update was
            # skipped because a loss or gradient was not finite.
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.reducer_context = self._reducer_context()
        with calling("reducer", reducer_label, "cannot be built:"):
            build_state(reducer, self.reducer_context)
        device = placement.reduce_device
        self.train = OnDevice(tf.function(self._train), device)
        self.train_loop = OnDevice(tf.function(self._train_loop), device)
        self.evaluate = OnDevice(tf.function(self._evaluate), device)

    def _reducer_context(self) -> ReducerContext:
        """What a stateful reducer is built for: this model's gradients (the
        trainable variables' shapes and dtypes) on this placement."""
        trainable = self.model.trainable_variables
        replicas = self.variables.replica_variables()
        return ReducerContext(
            shapes=tuple(v.shape for v in trainable),
            dtypes=tuple(v.dtype for v in trainable),
            devices=tuple(self.placement.devices),
            destinations=tuple(self.variables.destinations),
            variables=self.variables.name,
            step=self.global_step,
            replicas=tuple(tuple(r) for r in replicas),
        )

    def trackables(self) -> dict:
        """Everything a checkpoint must hold to continue this run exactly:
        the variables, optimizer and loss-scale state, the reducer's state,
        the step counts and the epoch's sums."""
        state = stateful_part(self.reducer)
        return {
            **self.variables.trackables(),
            **self.loss_scale.trackables(),
            **({"reducer": state} if state is not None else {}),
            "global_step": self.global_step,
            "skipped": self.skipped,
            "epoch_sums": [self.loss_sum, self.correct_sum, self.samples, self.steps],
            # Its own key: a checkpoint written without top-k still restores
            # (engine.run.checkpoint.OPTIONAL).
            **({"top_k_sum": self.top_k_sum} if self.top_k else {}),
        }

    @property
    def top_k_name(self) -> str | None:
        """The top-k accuracy's name in outputs and records (`top5_accuracy`),
        or None without `top_k`."""
        return f"top{self.top_k}_accuracy" if self.top_k else None

    def reset_metrics(self) -> None:
        for var in (self.loss_sum, self.correct_sum, self.samples, self.top_k_sum):
            var.assign(0.0)
        self.steps.assign(0)

    def metrics(self) -> dict[str, float | None]:
        """Epoch averages so far: loss as Keras reports it (mean of step losses).

        Only updated steps count; with none yet (every step so far skipped or
        an overflow of the loss scale) loss and accuracy are None, not 0.
        """
        steps = int(self.steps.numpy())
        top = {self.top_k_name: None} if self.top_k else {}
        if not steps:
            return {"steps": 0, "loss": None, "accuracy": None, **top}
        samples = float(self.samples.numpy())
        if self.top_k:
            top[self.top_k_name] = float(self.top_k_sum.numpy()) / samples
        return {
            "steps": steps,
            "loss": float(self.loss_sum.numpy()) / steps,
            "accuracy": float(self.correct_sum.numpy()) / samples,
            **top,
        }

    def gradients(self, batches: Sequence[tuple[tf.Tensor, tf.Tensor]]) -> Reduced:
        """Reduced gradients and the towers' losses over their batches.

        `batches[k]` is tower k's (images, labels). Each tower's work is placed
        on its device; the reduction is the reducer's. The gradients come as
        one list per destination of the variable mode.
        """
        # Read once, before the update can change it, and passed to the towers
        # as a value: an XLA cluster cannot read a variable on another device.
        scale = self.loss_scale.value()
        results = []
        for tower, (images, labels) in zip(self.placement.towers, batches):
            with tf.device(tower.device), tf.name_scope(scopes.tower_scope(tower.index)):
                model = self.variables.model_for(tower.index)
                results.append(self._tower_gradients(model, images, labels, scale))
        self._write_state(results)
        # A reducer builds its ops in plain Python: unconverted by autograph,
        # its own frames stay in a traceback of an error it raises.
        reduce = tf.autograph.experimental.do_not_convert(self.reducer)
        with calling("reducer", self.reducer_label):
            grads = reduce(
                [r.grads for r in results], self.placement.devices,
                self.variables.destinations,
            )
        with tf.device(self.placement.reduce_device), tf.name_scope(scopes.REDUCE):
            return Reduced(
                grads,
                mean([r.loss for r in results]),
                tf.add_n([r.correct for r in results]),
                tf.stack([r.finite for r in results]),
                tf.add_n([r.top_k_correct for r in results]),
            )

    def _write_state(self, results: Sequence[TowerResult]) -> None:
        """With accumulation, each model copy's non-trainable variables take
        the values its towers' micro-batches left, written after every tower
        has read them, so no tower waits for another's loop. A copy shared
        by several towers takes the mean of their floating-point values
        (BatchNorm's moving statistics, moved by every tower's batches) and
        the last tower's others (dropout's seed counters)."""
        if self.accumulate == 1:
            return
        copies = {}
        for tower, result in zip(self.placement.towers, results):
            model = self.variables.model_for(tower.index)
            copies.setdefault(id(model), (model, []))[1].append(result.state)
        for model, states in copies.values():
            # On the step's own device (the reduce device), where a shared
            # copy lives.
            with tf.name_scope(scopes.UPDATE):
                for k, variable in enumerate(model.non_trainable_variables):
                    values = [state[k] for state in states]
                    if tf.as_dtype(variable.dtype).is_floating and len(values) > 1:
                        variable.assign(tf.add_n(values) / len(values))
                    else:
                        variable.assign(values[-1])

    def _next_batches(self, iterators, count: int = 1):
        """Each tower's next batch, or its next `count` stacked ([count, B, ...])."""
        batches = []
        for tower, iterator in zip(self.placement.towers, iterators):
            with tf.device(tower.device), tf.name_scope(scopes.input_scope(tower.index)):
                if count == 1:
                    batches.append(next(iterator))
                    continue
                micro = [next(iterator) for _ in range(count)]
                batches.append(tuple(tf.stack(part) for part in zip(*micro)))
        return batches

    def _samples(self, images) -> tf.Tensor:
        """How many samples a tower's step input holds (micro-batches too)."""
        shape = tf.shape(images, tf.int64)
        return shape[0] * shape[1] if self.accumulate > 1 else shape[0]

    def _train(self, iterators, allowed=True):
        """One step; the update and the metric sums are skipped when any tower's
        loss or gradient is not finite, so a bad batch never reaches the
        variables. With a dynamic loss scale, a step whose gradients overflowed
        only because of the scale lowers it and is marked `overflow`."""
        return self._update_on(self._next_batches(iterators, self.accumulate),
                               tf.convert_to_tensor(allowed))

    def _update_on_batches(self, batches, allowed):
        """`_train` after the input: one compiled program with `whole_step`.

        `allowed` false makes the step leave no trace in the variables, the
        loss scale or the counts (a step after a non-finite one in a loop
        that stops there; a reducer with state still runs its
        `after_update`, and the run stops without saving). Every count is
        kept by selects, not branches.
        """
        step = self.gradients(batches)
        with tf.device(self.placement.reduce_device), tf.name_scope(scopes.UPDATE):
            samples = tf.add_n([self._samples(images) for images, _ in batches])
            samples = tf.cast(samples, tf.float64)
            finite = tf.reduce_all(step.finite)
            # The mean loss is finite exactly when every tower's loss is.
            overflow = self.loss_scale.update(finite, tf.math.is_finite(step.loss), allowed)
            updates = tf.logical_and(finite, allowed)
            # The rate this step's update uses, read before the update counts it.
            rate = tf.cast(self.variables.learning_rate(), tf.float32)
        grads, extra = step.grads, {}
        if self.clip_norm:
            grads, extra["grad_norm"] = self._clipped(grads)
        self._apply(updates, grads)
        with tf.device(self.placement.reduce_device), tf.name_scope(scopes.UPDATE):
            zero = tf.constant(0.0, tf.float64)
            self.loss_sum.assign_add(tf.where(updates, tf.cast(step.loss, tf.float64), zero))
            self.correct_sum.assign_add(
                tf.where(updates, tf.cast(step.correct, tf.float64), zero))
            self.samples.assign_add(tf.where(updates, samples, zero))
            if self.top_k:
                self.top_k_sum.assign_add(
                    tf.where(updates, tf.cast(step.top_k_correct, tf.float64), zero))
                extra[self.top_k_name] = tf.cast(step.top_k_correct, tf.float64) / samples
            self.steps.assign_add(tf.cast(updates, tf.int64))
            # An overflow of the loss scale is routine, not a skipped step.
            skipped = tf.logical_and(allowed, tf.logical_not(finite | overflow))
            self.skipped.assign_add(tf.cast(skipped, tf.int64))
        state = stateful_part(self.reducer)
        if state is not None:  # after the update, skipped or not (local SGD's averaging)
            # Plain Python that builds ops, like the reducer: not converted.
            tf.autograph.experimental.do_not_convert(state.after_update)()
        with tf.device(self.placement.reduce_device):
            self.global_step.assign_add(tf.cast(allowed, tf.int64))
            return {
                "loss": step.loss,
                "accuracy": tf.cast(step.correct, tf.float64) / samples,
                "finite": step.finite,
                "overflow": overflow,
                "learning_rate": rate,
                **extra,
            }

    def _clipped(self, grads):
        """Each destination's reduced gradients scaled to a global norm of at
        most `clip_norm`, on that destination; and the norm before, the
        first destination's (every destination holds the same mean)."""
        clipped, norms = [], []
        for destination, each in zip(self.variables.destinations, grads):
            with tf.device(destination), tf.name_scope(scopes.UPDATE):
                scaled, norm = tf.clip_by_global_norm(list(each), self.clip_norm)
            clipped.append(scaled)
            norms.append(norm)
        return clipped, tf.cast(norms[0], tf.float32)

    def output_dtypes(self) -> dict:
        """The per-step outputs of `train` and their dtypes (`finite` per tower)."""
        dtypes = {"loss": tf.float32, "accuracy": tf.float64, "finite": tf.bool,
                  "overflow": tf.bool, "learning_rate": tf.float32}
        if self.clip_norm:
            dtypes["grad_norm"] = tf.float32
        if self.top_k:
            dtypes[self.top_k_name] = tf.float64
        return dtypes

    def _apply(self, updates: tf.Tensor, grads) -> None:
        """The variable mode's update where `updates` is true.

        In a step compiled whole by XLA a `tf.cond` becomes a conditional,
        and a GPU decides a conditional on the host: it copies the predicate
        there and waits for everything queued before it. There the update
        always runs and a select keeps the old values of what it wrote
        (fused into the update's own kernels); elsewhere a `tf.cond` skips
        the update's work.
        """
        if not self.whole_step:
            def update():
                self.variables.apply(grads)
                return tf.constant(True)

            with tf.device(self.placement.reduce_device):
                tf.cond(updates, update, lambda: tf.constant(False))
            return
        written = self.variables.updated_variables()
        before = [tf.identity(variable) for variable in written]
        self.variables.apply(grads)
        for variable, old in zip(written, before):
            variable.assign(tf.where(updates, tf.identity(variable), old))

    def _train_loop(self, iterators, count, halt: bool = True):
        """`count` steps in one call (a `tf.while_loop`), so the host
        dispatches once per `count` steps; returns each step's outputs
        stacked (`output_dtypes`: [count], `finite` [count, towers]).

        Nothing in the loop waits on the GPU: its condition is a host
        counter. With `halt`, the steps after one whose loss or gradient
        was not finite (and not a loss-scale overflow) leave no trace, so
        the variables and counts are those after that step, as with one
        step per call; the caller reads its number from `finite`.
        """
        # An int32 argument stays in host memory (/cpu:0); the loop's control
        # would follow it there, off the device the step is called on.
        count = tf.identity(count)
        stacks = {key: tf.TensorArray(dtype, size=count)
                  for key, dtype in self.output_dtypes().items()}
        allowed = tf.constant(True)
        for k in tf.range(count):
            outputs = self._train(iterators, allowed)
            stacks = {key: stack.write(k, outputs[key]) for key, stack in stacks.items()}
            if halt:
                healthy = tf.logical_or(tf.reduce_all(outputs["finite"]), outputs["overflow"])
                allowed = tf.logical_and(allowed, healthy)
        return {key: stack.stack() for key, stack in stacks.items()}

    def _evaluate(self, iterators, valid):
        """Loss sum, correct count and sample count over the real samples
        (and, with `top_k`, the top-k count).

        `valid[k]` is how many of tower k's samples are real; the rest are the
        padding DALI adds to the shard's last batch.
        """
        return self._evaluate_on(self._next_batches(iterators), valid)

    def _evaluate_on_batches(self, batches, valid):
        sums = []
        for tower, (images, labels) in zip(self.placement.towers, batches):
            with tf.device(tower.device), tf.name_scope(scopes.tower_scope(tower.index)):
                labels = sample_labels(labels)
                model = self.variables.model_for(tower.index)
                with calling("model", self.model_label, "cannot evaluate here:"):
                    outputs = tf.cast(model(images, training=False), tf.float32)
                real = tf.cast(tf.range(tf.shape(labels)[0]) < valid[tower.index], tf.float32)
                loss = tf.reduce_sum(self.loss(labels, outputs) * real)
                correct = tf.reduce_sum(count_correct(labels, outputs) * real)
                counts = [loss, correct, tf.reduce_sum(real)]
                if self.top_k:
                    counts.append(tf.reduce_sum(count_correct(labels, outputs, self.top_k)
                                                * real))
                sums.append(tf.stack(counts))
        with tf.device(self.placement.reduce_device), tf.name_scope(scopes.REDUCE):
            return tf.add_n(sums)
