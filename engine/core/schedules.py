"""Learning-rate schedules: a linear warm-up, then a shape over the rest of the run.

The recipes for ResNet-50 at large batch (Goyal et al., "Accurate, Large
Minibatch SGD"; NVIDIA's and tf_cnn_benchmarks' recipes) warm the rate up
linearly from near zero to the scaled rate over a few epochs, then decay it
in steps or along a cosine. Here the rate the header prints is where the
warm-up ends. A schedule counts the optimizer's updates (Keras' `iterations`):
a skipped step moves it no further, and a restored checkpoint puts it back
where it was, so a resumed run goes on along the same curve.

`Schedule` holds the choice and checks it before TensorFlow starts;
`LearningRate` is the Keras `LearningRateSchedule` an optimizer is built
with. The run's lengths (steps per epoch, the steps in all) are set when
`fit` knows them, in variables, so a longer second `fit` stretches the curve.
"""

from __future__ import annotations

import dataclasses
import math

from engine.errors import UsageError

__all__ = ["LearningRates", "SHAPES", "Schedule", "from_function", "of", "parse"]

SHAPES = ("constant", "step", "cosine", "poly")
SPEC_HELP = "constant, step:EPOCHS:FACTOR (step:30:0.1), cosine or poly[:POWER]"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
    """How the learning rate moves over a run.

    Attributes:
      shape: `constant`, `step` (times `factor` every `every_epochs`),
        `cosine` (to zero at the last step) or `poly` (`(1 - progress) **
        power`, to zero at the last step); after the warm-up.
      every_epochs: with `step`, epochs between decays.
      factor: with `step`, what each decay multiplies by.
      power: with `poly`, the polynomial's power.
      warmup_epochs: epochs of linear warm-up from rate/steps to the rate
        (0: none).

    Raises:
      UsageError: naming the argument and what would be valid.
    """

    shape: str = "constant"
    every_epochs: float = 0.0
    factor: float = 0.1
    power: float = 2.0
    warmup_epochs: float = 0.0

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise UsageError(f"<lr_schedule> {self.shape!r} is not one of {SPEC_HELP}")
        if self.shape == "step" and not self.every_epochs > 0:
            raise UsageError(
                f"<lr_schedule> step needs its epochs between decays, above 0 "
                f"(got {self.every_epochs:g}): step:EPOCHS:FACTOR, e.g. step:30:0.1")
        if self.shape == "step" and not 0 < self.factor < 1:
            raise UsageError(
                f"<lr_schedule> step's factor ({self.factor:g}) must be between 0 and 1, "
                "e.g. step:30:0.1")
        if self.shape == "poly" and not self.power > 0:
            raise UsageError(f"<lr_schedule> poly's power ({self.power:g}) must be above 0")
        if not (self.warmup_epochs >= 0 and math.isfinite(self.warmup_epochs)):
            raise UsageError(f"<warmup_epochs> ({self.warmup_epochs:g}) must be 0 or more")

    @property
    def plain(self) -> bool:
        """A constant rate without warm-up: the optimizer gets a number."""
        return self.shape == "constant" and not self.warmup_epochs

    def check_length(self, epochs: int) -> None:
        """Refuses a warm-up that the run's `epochs` do not outlast."""
        if self.warmup_epochs >= epochs:
            raise UsageError(
                f"<warmup_epochs> ({self.warmup_epochs:g}) must be shorter than the run "
                f"(<epochs={epochs}>)")

    def describe(self) -> str:
        """For the header: the curve in words."""
        warm = (f"linear warm-up over {self.warmup_epochs:g} epoch"
                f"{'s' * (self.warmup_epochs != 1)}, then " if self.warmup_epochs else "")
        shape = {"constant": "constant",
                 "step": f"x{self.factor:g} every {self.every_epochs:g} epochs",
                 "cosine": "cosine decay to 0", "poly": f"poly decay (power {self.power:g}) to 0"}
        return f"{warm}{shape[self.shape]}"


def parse(spec: str, warmup_epochs: float = 0.0) -> Schedule:
    """A Schedule from its command-line spelling: `constant`, `cosine`,
    `poly[:POWER]`, `step:EPOCHS:FACTOR`.

    Raises:
      UsageError: naming `lr_schedule` and the valid spellings.
    """
    name, *fields = spec.split(":")
    try:
        numbers = [float(field) for field in fields]
    except ValueError:
        raise UsageError(f"<lr_schedule> {spec!r} is not one of {SPEC_HELP}") from None
    wanted = {"constant": 0, "cosine": 0, "poly": 1, "step": 2}.get(name)
    if wanted is None or len(numbers) > wanted or (name == "step" and len(numbers) != 2):
        raise UsageError(f"<lr_schedule> {spec!r} is not one of {SPEC_HELP}")
    keys = {"poly": ("power",), "step": ("every_epochs", "factor")}.get(name, ())
    return Schedule(shape=name, warmup_epochs=warmup_epochs, **dict(zip(keys, numbers)))


def of(lr_schedule, warmup_epochs: float = 0.0):
    """What a run's `lr_schedule` argument gives the optimizers: a Schedule
    (from its spelling, or given), or the user's own schedule as it is (a
    Keras `LearningRateSchedule`, or a function of the update count).

    Raises:
      UsageError: a bad spelling, or a warm-up asked of the user's own schedule.
    """
    if isinstance(lr_schedule, str):
        return parse(lr_schedule, warmup_epochs)
    if isinstance(lr_schedule, Schedule):
        return (dataclasses.replace(lr_schedule, warmup_epochs=warmup_epochs)
                if warmup_epochs else lr_schedule)
    if not callable(lr_schedule):
        raise UsageError(f"<lr_schedule> {lr_schedule!r} is not one of {SPEC_HELP}, a "
                         "keras.optimizers.schedules.LearningRateSchedule or a function "
                         "of the step")
    if warmup_epochs:
        raise UsageError("<warmup_epochs> warms up the built-in schedules; build the "
                         "warm-up into your own <lr_schedule>")
    return lr_schedule


def from_function(function):
    """A Keras LearningRateSchedule for `function`, unless it is one: a
    function of the update count (from 0) that returns the rate."""
    import keras

    if isinstance(function, keras.optimizers.schedules.LearningRateSchedule):
        return function

    class OfFunction(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            return function(step)

        def get_config(self):
            return {}

    return OfFunction()


class LearningRates:
    """The `LearningRate` of every optimizer of a run (one per variable copy),
    made by `new`, and given the run's lengths together by `set_lengths`."""

    def __init__(self, rate: float, schedule: Schedule):
        self.rate = rate
        self.schedule = schedule
        self.made: list = []

    def new(self):
        """A new schedule for one optimizer (its variables on the current device)."""
        made = _learning_rate_class()(self.rate, self.schedule)
        self.made.append(made)
        return made

    def set_lengths(self, steps_per_epoch: int, total_steps: int) -> None:
        for made in self.made:
            made.steps_per_epoch.assign(float(steps_per_epoch))
            made.total_steps.assign(float(total_steps))

    def at(self, update: int) -> float:
        """The rate of update number `update` (counted from 0), on the host."""
        return float(self.made[0](update)) if self.made else self.rate


def _learning_rate_class():
    """LearningRate, defined once Keras may be imported (not at module import:
    Schedule is checked before TensorFlow starts)."""
    global _LearningRate
    if _LearningRate is not None:
        return _LearningRate
    import keras
    import tensorflow as tf

    class LearningRate(keras.optimizers.schedules.LearningRateSchedule):
        """`rate` times the warm-up's ramp times the shape's factor at an
        update count; the run's lengths are variables (`LearningRates`)."""

        def __init__(self, rate: float, schedule: Schedule):
            self.rate = rate
            self.schedule = schedule
            self.steps_per_epoch = tf.Variable(1.0, trainable=False, name="steps_per_epoch")
            self.total_steps = tf.Variable(1.0, trainable=False, name="total_steps")

        def __call__(self, step):
            s = self.schedule
            # Update number `step` (from 0) is the (step + 1)-th.
            done = tf.cast(step, tf.float32) + 1.0
            warm = s.warmup_epochs * self.steps_per_epoch
            ramp = tf.minimum(1.0, done / tf.maximum(warm, 1.0)) if s.warmup_epochs else 1.0
            after = tf.maximum(done - warm, 0.0)
            span = tf.maximum(self.total_steps - warm, 1.0)
            progress = tf.minimum(after / span, 1.0)
            if s.shape == "step":
                shape = s.factor ** tf.floor(
                    (done - 1.0) / (s.every_epochs * self.steps_per_epoch))
            elif s.shape == "cosine":
                shape = 0.5 * (1.0 + tf.cos(math.pi * progress))
            elif s.shape == "poly":
                shape = (1.0 - progress) ** s.power
            else:
                shape = 1.0
            return self.rate * ramp * shape

        def get_config(self):
            return {"rate": self.rate, **dataclasses.asdict(self.schedule)}

    _LearningRate = LearningRate
    return LearningRate


_LearningRate = None
