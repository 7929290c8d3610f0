"""The options of the step and its loop: what to train, and how long.

Frozen, keyword-only dataclasses; each rule about an argument lives in its
class's `__post_init__`, with an error that names the argument. Nothing here
imports TensorFlow, so a run's arguments are checked before it starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from engine import errors
from engine.core.schedules import Schedule
from engine.errors import UsageError
from engine.userfn import label

__all__ = ["COMPUTE_DTYPES", "LoopOptions", "ModelOptions", "OPTIMIZERS", "TOP_K_CLASSES",
           "VARIABLE_MODES", "default_learning_rate", "refuse_optimizer_object"]

# Where the variables live: one copy on the reduce device, or one per tower
# (engine.core.variables).
VARIABLE_MODES = ("reduce-device", "replicated")
# What the layers compute in (engine.core.precision).
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
# From this many classes on, top-5 accuracy is reported unless asked
# otherwise: ImageNet's 1000 classes, CIFAR-100's 100.
TOP_K_CLASSES = 100


def _keras_optimizer(name: str, **arguments):
    def make(learning_rate: float, **more):
        import keras

        return getattr(keras.optimizers, name)(learning_rate, **arguments, **more)

    return make


# The named optimizers: each makes a new Keras optimizer for a learning rate
# (and Keras' optimizer arguments, such as weight_decay).
OPTIMIZERS = {
    "sgd": _keras_optimizer("SGD"),
    "momentum": _keras_optimizer("SGD", momentum=0.9),
    "adam": _keras_optimizer("Adam"),
    "rmsprop": _keras_optimizer("RMSprop"),
}

# Learning rates tuned for a batch of 32, and how each optimizer scales with
# the global batch (sum over towers): adaptive optimizers by the square root
# of the batch ratio, plain SGD linearly (Goyal et al., 2017).
BASE_BATCH = 32
BASE_LEARNING_RATES = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "rmsprop": 1e-3}
LINEAR_SCALING = ("sgd", "momentum")


def default_learning_rate(optimizer: str, global_batch: int) -> tuple[float, str]:
    """The learning rate used when `learning_rate` is not given, and how it
    was derived."""
    base = BASE_LEARNING_RATES[optimizer]
    ratio = global_batch / BASE_BATCH
    if optimizer in LINEAR_SCALING:
        return base * ratio, f"{base:g} x {global_batch}/{BASE_BATCH}"
    return base * ratio**0.5, f"{base:g} x sqrt({global_batch}/{BASE_BATCH})"


Optimizer = str | Callable  # a name of OPTIMIZERS, or a function returning an optimizer


def refuse_optimizer_object(value) -> None:
    """A Keras optimizer object given as `optimizer` (told by its interface:
    keras is not imported to check an argument) is refused with the form
    that works: each variable copy needs an optimizer of its own, and one
    made before the Trainer has started TensorFlow too early to split devices.

    Raises:
      UsageError: naming the object's class and the function to give instead.
    """
    if all(hasattr(value, name) for name in ("apply", "get_config", "from_config",
                                             "learning_rate")):
        name = type(value).__name__
        raise UsageError(
            f"<optimizer> a {name} object: each variable copy needs an optimizer of its "
            "own, and one made before the Trainer starts TensorFlow too early to split "
            f"devices; give a function that makes it: optimizer=lambda: "
            f"keras.optimizers.{name}(...)"
        )


def _shown(value) -> str:
    """A value for a message: a str as it is, anything else by its type."""
    return repr(value) if isinstance(value, str) else f"<a {type(value).__name__} object>"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopOptions:
    """How long to train and how often to look.

    Attributes:
      epochs: number of epochs.
      steps_per_epoch: training steps per epoch (one step = one batch per tower).
      eval_steps: held-out batches per tower after each epoch; 0 skips it.
      metrics_path: file that gets one JSON line per epoch, or None.
      check_replicas: with replicated variables, compare the copies every this
        many steps (0: never) and stop if they differ by more than
        `replica_tolerance`.
      steps_per_loop: training steps per call of the compiled step (Orbit's
        `steps_per_loop`, Keras' `steps_per_execution`): the host dispatches
        and looks at the run (progress, checkpoints, signals, the
        non-finite guard) once per loop, which ends early at an epoch's end
        or a non-finite step.
    """

    epochs: int
    steps_per_epoch: int
    eval_steps: int
    metrics_path: str | None = None
    check_replicas: int = 0
    replica_tolerance: float = 1e-6
    steps_per_loop: int = 1

    def __post_init__(self):
        for name in ("epochs", "steps_per_epoch"):
            value = getattr(self, name)
            if value < 1:
                raise UsageError(f"<{name}> ({value}) must be a positive integer")
        if self.eval_steps < 0:
            raise UsageError(f"<eval_steps> ({self.eval_steps}) must be 0 or more")
        if self.check_replicas < 0:
            raise UsageError(f"<check_replicas> ({self.check_replicas}) must be 0 or more")
        if self.steps_per_loop < 1:
            raise UsageError(
                f"<steps_per_loop> ({self.steps_per_loop}) must be a positive integer"
            )
        if self.check_replicas % self.steps_per_loop:
            raise UsageError(
                f"<check_replicas={self.check_replicas}> is not a multiple of "
                f"<steps_per_loop={self.steps_per_loop}>; the replicas are compared "
                "between loops"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
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
      from_logits: the default loss takes logits instead (Keras'
        `from_logits=True`).
      seed: seeds model initialisation and dropout (DALI gets its own seeds).
      learning_rate_note: how a default learning rate was derived, for the log.
      variables: `reduce-device` (one copy, on the reduce device) or
        `replicated` (a copy per tower, kept identical).
      compute_dtype: what the layers compute in: `float32`, or with mixed
        precision `bfloat16` (CPU towers) or `float16` (GPU towers, with
        dynamic loss scaling). Variables and the loss stay float32.
      xla: compile with XLA (engine.core.step.TowerStep); the variables
        must be on the towers' devices (engine.core.variables.check_xla).
      schedule: how the learning rate of an OPTIMIZERS optimizer moves
        (engine.core.schedules.Schedule: a warm-up, then a shape), or a
        Keras `LearningRateSchedule` it is built with instead of a number.
      clip_norm: clip the reduced gradients to this global norm (None: no
        clipping).
      label_smoothing: the default loss's label smoothing, 0 to below 1
        (the held-out loss is the same smoothed loss, as in Keras).
      weight_decay: decoupled weight decay of a named optimizer (as AdamW,
        SGDW: each update also takes rate x decay x the variable away), on
        the variables of two or more dimensions only
        (engine.core.variables.exclude_from_decay).
      metrics_top_k: also report top-k accuracy (`top5_accuracy` for 5),
        0 for none; None: 5 with TOP_K_CLASSES classes or more, else none
        (`top_k_for`).
      accumulate: micro-batches per tower per step (gradient
        accumulation): a step's one reduction and update take the mean
        gradient of `accumulate` batches per tower, run in turn.
      ema: the momentum of an exponential moving average of the weights
        (0: none; engine.core.step.TowerStep): evaluation, checkpoints and
        saving use the averaged weights.

    Raises:
      UsageError: naming the argument, its value and what would be valid.
    """

    model: Callable
    model_name: str = ""
    optimizer: Optimizer = "adam"
    learning_rate: float = 1e-3
    loss: object = None
    from_logits: bool = False
    seed: int = 0
    learning_rate_note: str = ""
    variables: str = "reduce-device"
    compute_dtype: str = "float32"
    xla: bool = False
    schedule: object = Schedule()
    clip_norm: float | None = None
    label_smoothing: float = 0.0
    weight_decay: float = 0.0
    metrics_top_k: int | None = None
    accumulate: int = 1
    ema: float = 0.0

    def __post_init__(self):
        if not self.model_name:
            object.__setattr__(self, "model_name", label(self.model))
        refuse_optimizer_object(self.optimizer)
        if not callable(self.optimizer) and self.optimizer not in OPTIMIZERS:
            raise UsageError(
                f"<optimizer> {_shown(self.optimizer)} is not one of {', '.join(OPTIMIZERS)}, "
                "a Keras optimizer, or a function that returns one"
            )
        if self.from_logits and self.loss is not None:
            raise UsageError(
                "<from_logits=True> is for the default loss; a <loss> of your own says "
                "itself what it takes (keras.losses.SparseCategoricalCrossentropy("
                "from_logits=True), for one)"
            )
        if not self.learning_rate > 0:
            raise UsageError(f"<learning_rate> ({self.learning_rate}) must be positive")
        if self.clip_norm is not None and not (self.clip_norm > 0
                                               and math.isfinite(self.clip_norm)):
            raise UsageError(f"<clip_norm> ({self.clip_norm}) must be a positive number")
        if not 0 <= self.label_smoothing < 1:
            raise UsageError(
                f"<label_smoothing> ({self.label_smoothing}) must be at least 0 and below 1 "
                "(0.1 is the ResNet-50 recipes')")
        if self.label_smoothing and self.loss is not None:
            raise UsageError(
                "<label_smoothing> smooths the default loss; give your own <loss> its "
                "smoothing itself")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise UsageError(f"<weight_decay> ({self.weight_decay}) must be 0 or more "
                             "(1e-4 and 5e-5 are the ResNet-50 recipes')")
        if self.weight_decay and not isinstance(self.optimizer, str):
            raise UsageError("<weight_decay> is for a named optimizer; give your own "
                             "optimizer its weight_decay itself")
        plain = isinstance(self.schedule, Schedule) and self.schedule.plain
        if not plain and not isinstance(self.optimizer, str):
            raise UsageError(
                "<lr_schedule> and <warmup_epochs> are for a named optimizer; give your "
                "own optimizer its schedule (keras.optimizers.schedules) itself")
        if self.metrics_top_k is not None and self.metrics_top_k < 0:
            raise UsageError(f"<metrics_top_k> ({self.metrics_top_k}) must be 0 (none) or "
                             "more (5 for top-5 accuracy)")
        if self.accumulate < 1:
            raise UsageError(f"<accumulate> ({self.accumulate}) must be at least 1 "
                             "(1: no accumulation)")
        if not 0 <= self.ema < 1:
            raise UsageError(f"<ema> ({self.ema}) must be at least 0 and below 1 (0.999 "
                             "averages over about the last 1,000 updates; 0: none)")
        if self.variables not in VARIABLE_MODES:
            raise UsageError(
                f"<variables> {self.variables!r} is not one of {', '.join(VARIABLE_MODES)}"
            )
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise UsageError(
                f"<compute_dtype> {self.compute_dtype!r} is not one of "
                f"{', '.join(COMPUTE_DTYPES)}"
            )

    def top_k_for(self, num_classes: int) -> int:
        """The top-k accuracy a run of `num_classes` classes reports (0: none).

        Raises:
          UsageError: a k not below the number of classes (every label
            would be among the k largest).
        """
        if self.metrics_top_k is None:
            return 5 if num_classes >= TOP_K_CLASSES else 0
        if self.metrics_top_k and self.metrics_top_k >= num_classes:
            raise UsageError(
                f"<metrics_top_k> ({self.metrics_top_k}) must be below the number of "
                f"classes ({num_classes}), or 0 for none")
        return self.metrics_top_k

    # Settings of the step that a checkpoint only fits where they are used:
    # left out of the run's signature at their defaults, so that checkpoints
    # of runs before them still fit (engine.run.describe.run_signature).
    _CHECKPOINT_OPTIONAL = ("accumulate", "ema")

    def checkpoint_settings(self) -> dict:
        """What a checkpoint's variables only fit, by the names of the run's
        signature: the model, the variable mode, the precision, and the
        step's settings that are not at their defaults."""
        defaults = self.checkpoint_defaults()
        return {"model": self.model_name, "variables": self.variables,
                "precision": self.compute_dtype,
                **{name: getattr(self, name) for name in defaults
                   if getattr(self, name) != defaults[name]}}

    @classmethod
    def checkpoint_defaults(cls) -> dict:
        """The step's settings a signature leaves out at these defaults."""
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        return {name: fields[name] for name in cls._CHECKPOINT_OPTIONAL}

    def notes(self) -> list[str]:
        """How these options change the update or the figures, as the run's
        header says it (the learning rate's line), one phrase each."""
        notes = []
        if self.label_smoothing:
            notes.append(f"labels smoothed by {self.label_smoothing:g}")
        if self.clip_norm:
            notes.append(f"gradients clipped to global norm {self.clip_norm:g} after the mean")
        if self.metrics_top_k:
            notes.append(f"top-{self.metrics_top_k} accuracy reported")
        if self.ema:
            notes.append(f"weights averaged (EMA {self.ema:g}): evaluation, checkpoints and "
                         "saving use the averages")
        return notes

    def step_settings(self, num_classes: int) -> dict:
        """What engine.core.step.TowerStep takes from these options beyond the
        variables, loss and reducer: its keyword arguments, for a run of
        `num_classes` classes. A setting of the update step is declared here
        and in TowerStep, and reaches it with nothing in between."""
        return {"xla": self.xla, "model_label": self.model_name, "clip_norm": self.clip_norm,
                "top_k": self.top_k_for(num_classes), "accumulate": self.accumulate,
                "ema": self.ema}

    @property
    def optimizer_name(self) -> str:
        """The optimizer as the run's header names it."""
        return self.optimizer if isinstance(self.optimizer, str) else label(self.optimizer)

    def make_optimizer(self, learning_rate=None):
        """A new Keras optimizer, for one variable copy; a named one with
        `learning_rate` (a number or a Keras schedule) if given."""
        import keras

        if isinstance(self.optimizer, str):
            decay = {"weight_decay": self.weight_decay} if self.weight_decay else {}
            return OPTIMIZERS[self.optimizer](
                self.learning_rate if learning_rate is None else learning_rate, **decay)
        optimizer = self.optimizer()
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise UsageError(
                f"<optimizer> {self.optimizer_name!r} returned {type(optimizer).__name__}, "
                "not a keras.optimizers.Optimizer"
            )
        return optimizer


# Their fields are arguments that messages name (engine.errors.declare).
errors.declare(LoopOptions)
errors.declare(ModelOptions)
