"""The training and evaluation steps: every tower, the reduction, the update.

Each tower runs forward *and* backward under its own `tf.device`
(engine.core.tower). Variables live where the variable mode keeps them;
towers read them. One `tf.function` holds all towers, the reduction and the
update; what XLA compiles of it is engine.core.compile's.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine import scopes
from engine.core.compile import CompilePolicy
from engine.core.loss_scale import NoLossScale
from engine.core.losses import Loss, sparse_cross_entropy
from engine.core.on_device import OnDevice
from engine.core.outputs import GRAD_NORM, OUTPUT_DTYPES, TOP_K, Reduced, StepOutputs
from engine.core.sums import EpochSums
from engine.core.tower import (
    accumulated,
    count_correct,
    evaluation_counts,
    tower_gradients,
    write_state,
)
from engine.core.variables import VariableMode, copies
from engine.reducers.base import Reducer, mean
from engine.reducers.stateful import ReducerContext, build_state, stateful_part
from engine.topology.devices import Placement
from engine.userfn import calling

__all__ = ["TowerStep", "count_correct", "tower_gradients"]


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
      xla: compile with XLA (engine.core.compile.CompilePolicy): the whole
        step where the towers, variables and reduce device are one device,
        else each tower's forward and backward.
      loss: per-sample loss of (labels, outputs) (engine.core.losses);
        default: cross-entropy of softmax outputs.
      clip_norm: scale the reduced gradients so their global norm is at
        most this (after the reduction: every copy applies the same
        clipped mean); the step's `grad_norm` output is the norm before.
      top_k: also count the samples whose label is among the k largest
        outputs (`top_k_name`, top-5 accuracy for k=5); 0: not.
      accumulate: micro-batches per tower per step (gradient
        accumulation): each tower takes this many batches in turn and
        averages their gradients (engine.core.tower.accumulated) before
        the one reduction and update of the step.
      ema: keep an exponential moving average of the trainable weights
        with this momentum (0: none), as Keras' `use_ema`: the first
        update's weights start it, then each update makes it
        `ema * average + (1 - ema) * weights`. Between steps the model's
        variables hold the averages, so evaluation, checkpoints and saving
        see them; the weights being trained wait in `trained` and are put
        back for the towers and the update of each step.
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
        ema: float = 0.0,
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
        self.ema = ema

        one_tower = accumulated if accumulate > 1 else tower_gradients

        def forward_backward(model, images, labels, scale):
            return one_tower(model, images, labels, scale, loss, self.model_label, top_k)

        self.compile = CompilePolicy(xla, placement.one_device)
        self._tower_gradients = self.compile.tower(forward_backward)
        self._update_on = self.compile.step(self._update_on_batches)
        self._evaluate_on = self.compile.step(self._evaluate_on_batches)
        with tf.device(placement.reduce_device):
            # Running sums for the epoch's averages, read once per progress line.
            self.sums = EpochSums(top_k)
            # Steps taken since the run began, and steps whose update was
            # skipped because a loss or gradient was not finite.
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.reducer_context = self._reducer_context()
        with calling("reducer", reducer_label, "cannot be built:"):
            build_state(reducer, self.reducer_context)
        self.trained, self.averaging = [], None
        if ema:  # each trainable weight's trained value, beside it
            for variable in self._trainable():
                with tf.device(variable.value.device):
                    self.trained.append(tf.Variable(variable.value, trainable=False))
            with tf.device(placement.reduce_device):  # whether the averages have begun
                self.averaging = tf.Variable(False, trainable=False)
        device = placement.reduce_device
        self.train = OnDevice(tf.function(self._train), device)
        self.train_loop = OnDevice(tf.function(self._train_loop), device)
        self.evaluate = OnDevice(tf.function(self._evaluate), device)

    @property
    def whole_step(self) -> bool:
        """XLA compiles the whole update (engine.core.compile)."""
        return self.compile.whole_step

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
            **self.sums.trackables(),
            **({"ema_trained": self.trained, "ema_averaging": self.averaging}
               if self.ema else {}),
        }

    def _trainable(self) -> list:
        """The trainable variables of every model copy, in the copies' order."""
        return [v for model in copies(self.variables, self.placement)
                for v in model.trainable_variables]

    def _put_back_trained(self) -> list | None:
        """With `ema`: reads the averages the model holds and puts the trained
        weights back in their place for this step (before the averages have
        begun, the model's own are the trained ones); returns the averages."""
        if not self.ema:
            return None
        averages = []
        with tf.name_scope(scopes.UPDATE):
            for variable, trained in zip(self._trainable(), self.trained):
                with tf.device(trained.device):
                    averages.append(tf.identity(variable))
                    variable.assign(tf.where(self.averaging, trained, averages[-1]))
        return averages

    def _average(self, averages: list | None, updates: tf.Tensor) -> None:
        """With `ema`: keeps the trained weights aside and leaves the averages
        in the model, moved by this step's weights where it updated."""
        if not self.ema:
            return
        with tf.name_scope(scopes.UPDATE):
            begun = tf.identity(self.averaging)
            for variable, trained, average in zip(self._trainable(), self.trained, averages):
                with tf.device(trained.device):
                    weights = tf.identity(variable)
                    trained.assign(weights)
                    moved = self.ema * average + (1.0 - self.ema) * weights
                    variable.assign(tf.where(begun, tf.where(updates, moved, average),
                                             weights))
            with tf.device(self.placement.reduce_device):
                self.averaging.assign(tf.logical_or(begun, updates))

    @property
    def top_k_name(self) -> str | None:
        """The top-k accuracy's name in outputs and records (`top5_accuracy`),
        or None without `top_k`."""
        return self.sums.top_k_name

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
        if self.accumulate > 1:
            write_state([self.variables.model_for(t.index) for t in self.placement.towers],
                        results)
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

    def _train(self, iterators, allowed=True) -> StepOutputs:
        """One step; the update and the metric sums are skipped when any tower's
        loss or gradient is not finite, so a bad batch never reaches the
        variables. With a dynamic loss scale, a step whose gradients overflowed
        only because of the scale lowers it and is marked `overflow`."""
        return self._update_on(self._next_batches(iterators, self.accumulate),
                               tf.convert_to_tensor(allowed))

    def _update_on_batches(self, batches, allowed) -> StepOutputs:
        """`_train` after the input: one compiled program with `whole_step`.

        `allowed` false makes the step leave no trace in the variables, the
        loss scale or the counts (a step after a non-finite one in a loop
        that stops there; a reducer with state still runs its
        `after_update`, and the run stops without saving). Every count is
        kept by selects, not branches.
        """
        averages = self._put_back_trained()
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
        grads, grad_norm = step.grads, None
        if self.clip_norm:
            grads, grad_norm = self._clipped(grads)
        self._apply(updates, grads)
        with tf.device(self.placement.reduce_device), tf.name_scope(scopes.UPDATE):
            self.sums.add(updates, step.loss, step.correct, samples, step.top_k_correct)
            top = (tf.cast(step.top_k_correct, tf.float64) / samples if self.top_k
                   else None)
            # An overflow of the loss scale is routine, not a skipped step.
            skipped = tf.logical_and(allowed, tf.logical_not(finite | overflow))
            self.skipped.assign_add(tf.cast(skipped, tf.int64))
        state = stateful_part(self.reducer)
        if state is not None:  # after the update, skipped or not (local SGD's averaging)
            # Plain Python that builds ops, like the reducer: not converted.
            tf.autograph.experimental.do_not_convert(state.after_update)()
        self._average(averages, updates)
        with tf.device(self.placement.reduce_device):
            self.global_step.assign_add(tf.cast(allowed, tf.int64))
            return StepOutputs(step.loss, tf.cast(step.correct, tf.float64) / samples,
                               step.finite, overflow, rate, grad_norm, top)

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

    def _train_loop(self, iterators, count, halt: bool = True) -> StepOutputs:
        """`count` steps in one call (a `tf.while_loop`), so the host
        dispatches once per `count` steps; returns each step's outputs
        stacked ([count], `finite` [count, towers]).

        Nothing in the loop waits on the GPU: its condition is a host
        counter. With `halt`, the steps after one whose loss or gradient
        was not finite (and not a loss-scale overflow) leave no trace, so
        the variables and counts are those after that step, as with one
        step per call; the caller reads its number from `finite`.
        """
        # An int32 argument stays in host memory (/cpu:0); the loop's control
        # would follow it there, off the device the step is called on.
        count = tf.identity(count)
        present = [i for i in range(len(OUTPUT_DTYPES))
                   if (i != GRAD_NORM or self.clip_norm) and (i != TOP_K or self.top_k)]
        stacks = {i: tf.TensorArray(OUTPUT_DTYPES[i], size=count) for i in present}
        allowed = tf.constant(True)
        for k in tf.range(count):
            outputs = self._train(iterators, allowed)
            stacks = {i: stack.write(k, outputs[i]) for i, stack in stacks.items()}
            if halt:
                healthy = tf.logical_or(tf.reduce_all(outputs.finite), outputs.overflow)
                allowed = tf.logical_and(allowed, healthy)
        return StepOutputs(*(stacks[i].stack() if i in stacks else None
                             for i in range(len(OUTPUT_DTYPES))))

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
                model = self.variables.model_for(tower.index)
                sums.append(evaluation_counts(model, images, labels, valid[tower.index],
                                              self.loss, self.model_label, self.top_k))
        with tf.device(self.placement.reduce_device), tf.name_scope(scopes.REDUCE):
            return tf.add_n(sums)
