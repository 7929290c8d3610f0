"""What a run is made of: the models and optimizers where the variable mode
puts them, the reducer, the step, and one DALI iterator per tower and split.

Everything here takes option objects; nothing reads flags or the environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import tensorflow as tf

from engine import data, reducers
from engine.core import loop, loss_scale, precision
from engine.core import variables as variables_lib
from engine.core.losses import Loss, per_sample
from engine.core.step import TowerStep
from engine.errors import UsageError
from engine.topology.devices import Placement
from engine.userfn import label

__all__ = ["ModelOptions", "OPTIMIZERS", "Towers", "build", "default_learning_rate",
           "tower_iterators"]

OPTIMIZERS = {
    "sgd": lambda lr: keras.optimizers.SGD(lr),
    "momentum": lambda lr: keras.optimizers.SGD(lr, momentum=0.9),
    "adam": lambda lr: keras.optimizers.Adam(lr),
    "rmsprop": lambda lr: keras.optimizers.RMSprop(lr),
}


# Learning rates tuned for a batch of 32, and how each optimizer scales with
# the global batch (sum over towers): adaptive optimizers by the square root
# of the batch ratio, plain SGD linearly (Goyal et al., 2017).
BASE_BATCH = 32
BASE_LEARNING_RATES = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "rmsprop": 1e-3}
LINEAR_SCALING = ("sgd", "momentum")


def default_learning_rate(optimizer: str, global_batch: int) -> tuple[float, str]:
    """The learning rate used when --lr is not given, and how it was derived."""
    base = BASE_LEARNING_RATES[optimizer]
    ratio = global_batch / BASE_BATCH
    if optimizer in LINEAR_SCALING:
        return base * ratio, f"{base:g} x {global_batch}/{BASE_BATCH}"
    return base * ratio**0.5, f"{base:g} x sqrt({global_batch}/{BASE_BATCH})"


Optimizer = str | Callable[[], keras.optimizers.Optimizer]


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """What to train and how.

    Attributes:
      model: builds the model: called with `input_shape` and `num_classes`
        (towers.models.builder makes one from a zoo name, a spec or a user
        function), once per variable copy.
      model_name: how messages and checkpoints name the model; default: the
        function's label.
      optimizer: one of OPTIMIZERS (with `learning_rate`), or a function
        that returns a new Keras optimizer (called once per variable copy).
      learning_rate: the learning rate of an OPTIMIZERS optimizer.
      loss: the loss (engine.core.losses.per_sample): None for cross-entropy
        of softmax outputs, a `keras.losses.Loss`, or a per-sample function.
      seed: seeds model initialisation and dropout (DALI gets its own seeds).
      learning_rate_note: how a default learning rate was derived, for the log.
      variables: `reduce-device` (one copy, on the reduce device) or
        `replicated` (a copy per tower, kept identical).
      compute_dtype: what the layers compute in: `float32`, or with mixed
        precision `bfloat16` (CPU towers) or `float16` (GPU towers, with
        dynamic loss scaling). Variables and the loss stay float32.
      xla: compile with XLA (engine.core.step.TowerStep); the variables
        must be on the towers' devices (engine.core.variables.check_xla).

    Raises:
      UsageError: naming the argument, its value and what would be valid.
    """

    model: Callable[..., keras.Model]
    model_name: str = ""
    optimizer: Optimizer = "adam"
    learning_rate: float = 1e-3
    loss: Loss | keras.losses.Loss | None = None
    seed: int = 0
    learning_rate_note: str = ""
    variables: str = "reduce-device"
    compute_dtype: str = "float32"
    xla: bool = False

    def __post_init__(self):
        if not self.model_name:
            object.__setattr__(self, "model_name", label(self.model))
        if not callable(self.optimizer) and self.optimizer not in OPTIMIZERS:
            raise UsageError(
                f"<optimizer> {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)} "
                "or a function that returns a Keras optimizer"
            )
        if not self.learning_rate > 0:
            raise UsageError(f"<learning_rate> ({self.learning_rate}) must be positive")
        if self.variables not in variables_lib.MODES:
            raise UsageError(
                f"<variables> {self.variables!r} is not one of "
                f"{', '.join(variables_lib.MODES)}"
            )
        if self.compute_dtype not in precision.COMPUTE_DTYPES:
            raise UsageError(
                f"<compute_dtype> {self.compute_dtype!r} is not one of "
                f"{', '.join(precision.COMPUTE_DTYPES)}"
            )

    @property
    def optimizer_name(self) -> str:
        """The optimizer as the run's header names it."""
        return self.optimizer if isinstance(self.optimizer, str) else label(self.optimizer)

    def make_optimizer(self) -> keras.optimizers.Optimizer:
        """A new optimizer, for one variable copy."""
        if isinstance(self.optimizer, str):
            return OPTIMIZERS[self.optimizer](self.learning_rate)
        optimizer = self.optimizer()
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise UsageError(
                f"<optimizer> {self.optimizer_name!r} returned {type(optimizer).__name__}, "
                "not a keras.optimizers.Optimizer"
            )
        return optimizer


@dataclasses.dataclass
class Towers:
    """A built run: the step functions and each tower's iterators."""

    step: TowerStep
    train_iterators: list
    held_out: loop.HeldOut | None


def build(
    placement: Placement,
    data_options: data.DataOptions,
    model_options: ModelOptions,
    reducer_options: reducers.ReducerOptions,
    val_size: int | None,
) -> Towers:
    """Creates the model(s) and optimizer(s) where the variable mode puts them,
    the reducer, and one DALI dataset per tower (and per split) on its device."""
    keras.utils.set_random_seed(model_options.seed)

    def make_model():
        with precision.policy(model_options.compute_dtype):
            return model_options.model(
                input_shape=data.sample_shape(data_options),
                num_classes=data_options.num_classes,
            )

    step = TowerStep(
        variables=variables_lib.make(
            model_options.variables, make_model, model_options.make_optimizer, placement,
            xla=model_options.xla,
        ),
        placement=placement,
        reducer=reducers.build(reducer_options, placement),
        loss_scale=(
            loss_scale.DynamicLossScale(placement.reduce_device)
            if precision.needs_loss_scaling(model_options.compute_dtype)
            else loss_scale.NoLossScale()
        ),
        xla=model_options.xla,
        loss=per_sample(model_options.loss),
        model_label=model_options.model_name,
        reducer_label=reducer_options.label,
    )
    train_iterators = tower_iterators(data_options, placement, training=True)
    held_out = None
    if data_options.val_path and val_size:
        held_out = loop.HeldOut(
            tower_iterators(data_options, placement, training=False),
            size=val_size,
            batch_size=data_options.batch_size,
            num_towers=len(placement.towers),
        )
    return Towers(step, train_iterators, held_out)


def tower_iterators(
    data_options: data.DataOptions, placement: Placement, *, training: bool
) -> list:
    """One iterator per tower over its own DALI shard, created on its device."""
    iterators = []
    for tower in placement.towers:
        dataset = data.tower_dataset(data_options, tower, training=training)
        with tf.device(tower.device):
            iterators.append(iter(dataset))
    return iterators
