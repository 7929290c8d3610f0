"""Where the variables live: on the reduce device, or replicated on every tower.

A variable mode answers three questions for the step: which model copy tower
k calls, which devices need the reduced gradients (`destinations`), and how
the update is applied. Like tf_cnn_benchmarks' variable managers, one class
per mode behind that one interface.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import keras
import numpy as np
import tensorflow as tf

from engine import scopes
from engine.core.on_device import OnDevice
from engine.core.options import VARIABLE_MODES
from engine.errors import RunError, UsageError
from engine.topology.devices import Placement

MODES = VARIABLE_MODES  # engine.core.options holds them, for checks before TensorFlow


class VariableMode(Protocol):
    """What the step asks of a variable mode (ReduceDeviceVariables,
    ReplicatedVariables, or one of yours).

    Attributes:
      name: the mode's name (one of MODES for the built-ins), as a reducer
        with state is told it.
      model: the model copy the run describes and saves (tower 0's).
      destinations: the devices that need the reduced gradients.
    """

    name: str
    model: keras.Model
    destinations: list[str]

    def replica_variables(self) -> list[list[tf.Variable]]:
        """Per tower, the floating-point state of its own copy, aligned across
        towers (what local SGD averages); empty when the towers share one copy."""

    def model_for(self, tower: int) -> keras.Model:
        """The copy tower `tower` calls."""

    def trackables(self) -> dict:
        """What a checkpoint must hold: variables and optimizer state."""

    def apply(self, reduced: Sequence[Sequence[tf.Tensor]]) -> None:
        """Applies reduced[d], the mean for destinations[d], to the copies."""

    def updated_variables(self) -> list:
        """Every variable `apply` writes: the trainable variables and the
        optimizers' state (a step that must not update keeps their values)."""

    def learning_rate(self) -> tf.Tensor:
        """The rate the next update applies (tower 0's copy's optimizer)."""


def copies(variables: VariableMode, placement) -> list[keras.Model]:
    """Every distinct model copy the towers of `placement` call, in tower
    order: one with reduce-device variables, one per tower replicated."""
    return list({id(m): m for m in (variables.model_for(t.index)
                                    for t in placement.towers)}.values())


class ReplicaDriftError(RunError):
    """Replicated copies of a variable no longer agree."""


def updater(optimizer: keras.optimizers.Optimizer, model: keras.Model, xla: bool) -> Callable:
    """`update(grads)`: the optimizer's update of the model's trainable variables.

    With `xla`, compiled by XLA on the device it is called on: the update's
    dozens of small ops (Adam: about ten per variable) become a few fused
    kernels, where each op would otherwise be a kernel launch of its own.
    """

    def update(grads):
        optimizer.apply(list(grads), model.trainable_variables)

    return tf.function(update, jit_compile=True) if xla else update


def exclude_from_decay(optimizer: keras.optimizers.Optimizer, model: keras.Model) -> None:
    """With weight decay, none on the variables of fewer than two
    dimensions: biases and the scales and offsets of normalisation layers
    (the rule of Goyal et al. and the ResNet-50 recipes); before the
    optimizer is built."""
    if optimizer.weight_decay:
        optimizer.exclude_from_weight_decay(
            var_list=[v for v in model.trainable_variables if len(v.shape) < 2])


def decayed(model: keras.Model) -> tuple[int, int]:
    """(variables weight decay applies to, trainable variables), by
    `exclude_from_decay`'s rule."""
    variables = model.trainable_variables
    return sum(len(v.shape) >= 2 for v in variables), len(variables)


def written_by(optimizer: keras.optimizers.Optimizer, model: keras.Model) -> list:
    """What `optimizer.apply` on `model`'s trainable variables may write:
    those variables and the optimizer's own (step count, slots)."""
    return [*model.trainable_variables, *optimizer.variables]


class ReduceDeviceVariables:
    """One copy of every variable, on the reduce device; every tower reads it
    and one optimizer update runs there."""

    name = "reduce-device"

    def __init__(
        self,
        make_model: Callable[[], keras.Model],
        make_optimizer: Callable[[], keras.optimizers.Optimizer],
        placement: Placement,
        *,
        xla: bool = False,
    ):
        self.device = placement.reduce_device
        with tf.device(self.device):
            self.model = make_model()
            self.optimizer = make_optimizer()
            exclude_from_decay(self.optimizer, self.model)
            self.optimizer.build(self.model.trainable_variables)
        self.destinations = [self.device]
        self._update = updater(self.optimizer, self.model, xla)

    def model_for(self, tower: int) -> keras.Model:
        return self.model

    def replica_variables(self) -> list[list[tf.Variable]]:
        return []  # one copy, shared by every tower

    def trackables(self) -> dict:
        # Keras 3 models are not checkpoint-trackable objects of their own: list
        # every variable, the dropout seed generators' state among them.
        return {"model": list(self.model.variables), "optimizer": self.optimizer}

    def apply(self, reduced: Sequence[Sequence[tf.Tensor]]) -> None:
        with tf.device(self.device), tf.name_scope(scopes.UPDATE):
            self._update(reduced[0])

    def updated_variables(self) -> list:
        return written_by(self.optimizer, self.model)

    def learning_rate(self) -> tf.Tensor:
        return self.optimizer.learning_rate


class ReplicatedVariables:
    """A copy of every variable on each tower's device, identical at the start;
    each tower applies the same reduced mean to its own copy."""

    name = "replicated"

    def __init__(
        self,
        make_model: Callable[[], keras.Model],
        make_optimizer: Callable[[], keras.optimizers.Optimizer],
        placement: Placement,
        *,
        xla: bool = False,
    ):
        self.devices = list(placement.devices)
        self.models, self.optimizers = [], []
        for device in self.devices:
            with tf.device(device):
                model = make_model()
                optimizer = make_optimizer()
                exclude_from_decay(optimizer, model)
                optimizer.build(model.trainable_variables)
            self.models.append(model)
            self.optimizers.append(optimizer)
        weights = self.models[0].get_weights()
        for model in self.models[1:]:
            model.set_weights(weights)
        self.model = self.models[0]
        self.destinations = self.devices
        self._updates = [updater(o, m, xla) for o, m in zip(self.optimizers, self.models)]
        self._drift = OnDevice(tf.function(self._max_differences), self.devices[0])

    def model_for(self, tower: int) -> keras.Model:
        return self.models[tower]

    def trackables(self) -> dict:
        return {
            "models": [list(model.variables) for model in self.models],
            "optimizers": self.optimizers,
        }

    def replica_variables(self) -> list[list[tf.Variable]]:
        """Per tower, the replica's floating-point state, aligned across towers:
        every model variable (weights, statistics) and the optimizer's slots,
        not its step count or learning rate. What local SGD averages."""

        def floating(variables):
            return [v for v in variables if tf.as_dtype(v.dtype).is_floating]

        out = []
        for model, optimizer in zip(self.models, self.optimizers):
            slots = [v for v in optimizer.variables
                     if v is not optimizer.iterations
                     and v.path.rsplit("/", 1)[-1] != "learning_rate"]
            out.append(floating(model.variables) + floating(slots))
        return out

    def apply(self, reduced: Sequence[Sequence[tf.Tensor]]) -> None:
        for device, update, grads in zip(self.devices, self._updates, reduced):
            with tf.device(device), tf.name_scope(scopes.UPDATE):
                update(grads)

    def updated_variables(self) -> list:
        return [v for o, m in zip(self.optimizers, self.models) for v in written_by(o, m)]

    def learning_rate(self) -> tf.Tensor:
        return self.optimizers[0].learning_rate

    def _max_differences(self):
        """[towers - 1, variables]: max |copy - tower 0's copy|, on each tower."""
        reference = self.models[0].trainable_variables
        rows = []
        for device, model in zip(self.devices[1:], self.models[1:]):
            with tf.device(device):
                rows.append(
                    tf.stack(
                        [
                            tf.reduce_max(tf.abs(tf.cast(v - r, tf.float64)))
                            for v, r in zip(model.trainable_variables, reference)
                        ]
                    )
                )
        return tf.stack(rows) if rows else tf.zeros([0, len(reference)], tf.float64)

    def check(self, tolerance: float, step: int) -> float:
        """The largest difference between copies; raises past `tolerance`."""
        differences = self._drift().numpy()
        if differences.size == 0:
            return 0.0
        tower, variable = np.unravel_index(np.argmax(differences), differences.shape)
        worst = float(differences[tower, variable])
        if worst > tolerance:
            path = self.models[0].trainable_variables[variable].path
            raise ReplicaDriftError(
                f"<check_replicas>: after step {step}, tower {tower + 1}'s copy of "
                f"{path} differs from tower 0's by {worst:.3g} (tolerance "
                f"{tolerance:g}); the replicas no longer train the same model"
            )
        return worst


def check_xla(mode: str, placement: Placement) -> None:
    """Refuses XLA where a compiled tower would read variables on another device.

    An XLA cluster reads the variables itself, and TensorFlow cannot read a
    variable on another device from one ("Trying to access resource ...
    located in device"): with `reduce-device` variables, only a tower on the
    reduce device itself can be compiled.

    Raises:
      UsageError: naming both arguments and the fix.
    """
    if mode == "reduce-device" and not placement.one_device:
        raise UsageError(
            "<xla=True> <variables=reduce-device>: an XLA cluster reads the variables "
            "on its tower's device, and TensorFlow cannot read variables on the "
            "reduce device from a tower on another; add <variables=replicated>"
        )


def make(
    mode: str,
    make_model: Callable[[], keras.Model],
    make_optimizer: Callable[[], keras.optimizers.Optimizer],
    placement: Placement,
    *,
    xla: bool = False,
):
    """The variable mode called `mode` (one of MODES); with `xla`, its updates
    are compiled by XLA (`check_xla` says where that can be)."""
    if xla:
        check_xla(mode, placement)
    if mode == "reduce-device":
        return ReduceDeviceVariables(make_model, make_optimizer, placement, xla=xla)
    if mode == "replicated":
        return ReplicatedVariables(make_model, make_optimizer, placement, xla=xla)
    raise UsageError(f"<variables> {mode!r} is not one of {', '.join(MODES)}")
